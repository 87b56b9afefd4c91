//! Issue 27 end to end: failing and wedged disks under the real agent (its own process, with the
//! RBAC from deploy/) and the real control plane. A frozen filesystem (`fsfreeze -f`) is a disk
//! that stops answering: it must cost the node only that volume, never the pass, and come back by
//! itself once thawed. A read-only remount and recorded ext4 errors are failing disks: an
//! Available PV on one is withdrawn until the disk is healthy, a Bound one is flagged and its
//! claim's owner told. Needs root (real loop devices, ext4, tmpfs).
//!
//! Every test owns a [`Lab`]: its scratch directory, mounts, loop devices, frozen filesystems and
//! agent. Dropping it (also after a failed assertion) thaws first (a frozen filesystem can neither
//! be unmounted cleanly nor let the agent's stuck threads, and so the agent, exit), then stops the
//! agent, unmounts, and detaches the loop devices.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use local_static_provisioner::core::volumes::naming::{ANN_DISK_FAILING, pv_name};
use support::agent_checks::{available, capacity, class_map, events_about, gauge, metric_lines, unique};
use support::{
    AgentProcess, ControlPlane, quiet, remove_scratch_dir, require_root, run, umount_when_idle, wait_recycled,
    wait_until, write_config,
};

const WAIT: Duration = Duration::from_secs(60);
/// The per-operation deadline the agents here run with (the default is 10 s).
const HOST_OP_TIMEOUT: &str = "2s";

/// A test's scratch directory, what it mounted, attached and froze there, and its agent.
struct Lab {
    root: PathBuf,
    loops: Vec<PathBuf>,
    frozen: Vec<PathBuf>,
    /// FUSE daemons (bindfs) serving volumes here, and whether each is stopped (SIGSTOP).
    fuse: Vec<(std::process::Child, bool)>,
    agent: Option<AgentProcess>,
    /// The control plane the agent ran against: its PVs are deleted with the lab.
    cp_dir: Option<PathBuf>,
}

impl Lab {
    fn new(label: &str) -> Self {
        let root = tempfile::Builder::new().prefix(&format!("lsp-{label}-")).tempdir().unwrap().keep();
        std::fs::create_dir_all(root.join("images")).unwrap();
        Lab { root, loops: Vec::new(), frozen: Vec::new(), fuse: Vec::new(), agent: None, cp_dir: None }
    }

    /// A loop device over a sparse image of `mib` MiB, formatted ext4 and mounted at `point`
    /// with `options`. Returns the device.
    fn ext4(&mut self, point: &Path, mib: u64, options: &str) -> PathBuf {
        let img = self.root.join("images").join(point.file_name().unwrap());
        run(Command::new("truncate").arg("-s").arg(format!("{mib}M")).arg(&img));
        let out = run(Command::new("losetup").args(["--find", "--show"]).arg(&img));
        let dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        self.loops.push(dev.clone());
        run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&dev));
        mount_ext4(&dev, point, options);
        dev
    }

    /// A loop device over a sparse (blank) image of `mib` MiB named `name`. Returns the device.
    fn blank_loop(&mut self, name: &str, mib: u64) -> PathBuf {
        let img = self.root.join("images").join(name);
        run(Command::new("truncate").arg("-s").arg(format!("{mib}M")).arg(&img));
        let out = run(Command::new("losetup").args(["--find", "--show"]).arg(&img));
        let dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        self.loops.push(dev.clone());
        dev
    }

    /// A tmpfs of `mib` MiB mounted at `point`.
    fn tmpfs(&self, point: &Path, mib: u64) {
        std::fs::create_dir_all(point).unwrap();
        run(Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"]).arg(point));
    }

    /// Freezes the filesystem mounted at `point`: every write to it blocks until [`Self::thaw`].
    fn freeze(&mut self, point: &Path) {
        self.frozen.push(point.to_path_buf());
        run(Command::new("fsfreeze").arg("-f").arg(point));
    }

    /// A FUSE volume at `point` (bindfs of a fresh directory, in the foreground, so its PID is
    /// ours). Returns its index for [`Self::stop_fuse`].
    fn fuse(&mut self, point: &Path) -> usize {
        let source = self.root.join(format!("fuse-src-{}", self.fuse.len()));
        std::fs::create_dir_all(&source).unwrap();
        std::fs::create_dir_all(point).unwrap();
        let child = Command::new("bindfs").arg("-f").arg(&source).arg(point).spawn().expect("bindfs runs");
        self.fuse.push((child, false));
        wait_until("the FUSE mount", Duration::from_secs(10), || {
            support::mounts_under(&self.root).iter().any(|m| m == point).then_some(())
        });
        self.fuse.len() - 1
    }

    /// Stops (or continues) FUSE daemon `i`: every access to its volume blocks while stopped, as
    /// with a hung network filesystem or a crashed storage daemon.
    fn stop_fuse(&mut self, i: usize, stop: bool) {
        let signal = if stop { "-STOP" } else { "-CONT" };
        run(Command::new("kill").arg(signal).arg(self.fuse[i].0.id().to_string()));
        self.fuse[i].1 = stop;
    }

    fn thaw(&mut self, point: &Path) {
        self.frozen.retain(|p| p != point);
        run(Command::new("fsfreeze").arg("-u").arg(point));
    }

    /// Starts the agent for `node` with this class map and `--host-op-timeout 2s`.
    fn start_agent(&mut self, cp: &ControlPlane, node: &str, class_map: &str) -> &AgentProcess {
        self.start_agent_with(cp, node, class_map, &[])
    }

    /// [`Self::start_agent`] with `extra` flags.
    fn start_agent_with(&mut self, cp: &ControlPlane, node: &str, class_map: &str, extra: &[&str]) -> &AgentProcess {
        let config = self.root.join("config");
        write_config(&config, &[("storageClassMap", class_map)]);
        let kubeconfig = cp.agent_kubeconfig(&self.root);
        let log = self.root.join("agent.log");
        let mut flags = vec!["--host-op-timeout", HOST_OP_TIMEOUT];
        flags.extend_from_slice(extra);
        let agent = AgentProcess::start_with(&config, node, &kubeconfig, &log, &flags);
        self.cp_dir = Some(cp.dir.clone());
        self.agent.insert(agent)
    }

    fn agent(&self) -> &AgentProcess {
        self.agent.as_ref().expect("agent started")
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Thaw first: the agent's threads stuck on a frozen filesystem (and so the agent) cannot
        // exit before, and an unmount would leave it frozen for good.
        for p in std::mem::take(&mut self.frozen) {
            quiet(Command::new("fsfreeze").arg("-u").arg(&p));
        }
        for (child, stopped) in &self.fuse {
            if *stopped {
                quiet(Command::new("kill").arg("-CONT").arg(child.id().to_string()));
            }
        }
        if let Some(agent) = self.agent.take() {
            if std::thread::panicking() {
                let kept = std::env::temp_dir()
                    .join(format!("failing_disks-{}.log", self.root.file_name().unwrap_or_default().to_string_lossy()));
                let _ = std::fs::copy(&agent.log, &kept);
                eprintln!("agent log kept at {}", kept.display());
            }
            drop(agent);
        }
        if let Some(dir) = self.cp_dir.take() {
            ControlPlane::at(&dir).forget_pvs_under(&self.root.display().to_string());
        }
        for p in support::mounts_under(&self.root) {
            quiet(Command::new("umount").arg(&p));
        }
        // Unmounted, a FUSE daemon exits; one that does not is stopped by its own PID.
        for (mut child, _) in std::mem::take(&mut self.fuse) {
            if !matches!(child.try_wait(), Ok(Some(_))) {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
        for dev in self.loops.iter().rev() {
            quiet(Command::new("losetup").arg("-d").arg(dev));
        }
        remove_scratch_dir(&self.root, "failing_disks");
    }
}

fn mount_ext4(dev: &Path, point: &Path, options: &str) {
    std::fs::create_dir_all(point).unwrap();
    run(Command::new("mount").args(["-t", "ext4", "-o", options]).arg(dev).arg(point));
}

/// Makes ext4 on `dev` record an error, as a real one would (`trigger_fs_error`): the error
/// count rises (returns once it did); with `errors=remount-ro` the kernel also makes the filesystem read-only.
fn trigger_ext4_error(dev: &Path) {
    let name = dev.file_name().unwrap().to_string_lossy().into_owned();
    let trigger = PathBuf::from(format!("/sys/fs/ext4/{name}/trigger_fs_error"));
    assert!(trigger.exists(), "{} missing (kernel without the ext4 sysfs trigger)", trigger.display());
    std::fs::write(&trigger, "failing_disks test").unwrap();
    // The count lives in the superblock, which ext4 updates from a work item, a moment later.
    let count = PathBuf::from(format!("/sys/fs/ext4/{name}/errors_count"));
    wait_until("ext4's error count to rise", Duration::from_secs(10), || {
        std::fs::read_to_string(&count).ok().filter(|n| n.trim() != "0").map(|_| ())
    });
}

/// Waits until the agent ran no pass for 3 s: nothing (an API watch event, a settle deadline)
/// would run one soon by chance.
fn wait_idle(agent: &AgentProcess) {
    let passes = || agent.log_text().matches("pass done").count();
    wait_until("the agent idle", WAIT, || {
        let before = passes();
        std::thread::sleep(Duration::from_secs(3));
        (passes() == before).then_some(())
    });
}

#[test]
fn frozen_new_volume_does_not_stop_the_healthy_ones() {
    let _area = support::area(module_path!());
    if !require_root("frozen_new_volume_does_not_stop_the_healthy_ones") {
        return;
    }
    let cp = ControlPlane::get();
    let (node, class) = (&unique("fd-frozen-new-node"), &unique("fd-frozen-new"));
    cp.create_node(node);
    cp.create_storage_class(class, "Delete");
    let mut lab = Lab::new("fd-frozen-new");
    let fs_dir = lab.root.join("fs");
    let frozen = fs_dir.join("frozen");
    lab.ext4(&frozen, 64, "defaults");
    lab.tmpfs(&fs_dir.join("a"), 16);
    lab.tmpfs(&fs_dir.join("b"), 16);
    lab.freeze(&frozen);

    let started = Instant::now();
    lab.start_agent(&cp, node, &class_map(class, &fs_dir));
    let (a, b, f) = (pv_name("a", node, class), pv_name("b", node, class), pv_name("frozen", node, class));
    wait_until("the 2 healthy PVs", WAIT, || {
        (available(&cp, &a).is_some() && available(&cp, &b).is_some()).then_some(())
    });
    let healthy_after = started.elapsed();
    eprintln!("healthy PVs Available {healthy_after:?} after the agent started (a frozen volume beside them)");
    assert!(healthy_after < Duration::from_secs(10), "the healthy volumes took {healthy_after:?}");
    assert!(cp.pv_state(&f).is_none(), "the frozen volume was published");

    // It is reported as unresponsive; the agent stays live.
    let path = frozen.display().to_string();
    let label = format!("path=\"{path}\"");
    let metrics = wait_until("the frozen volume in the unresponsive metric", WAIT, || {
        let m = lab.agent().admin_get("/metrics");
        (metric_lines(&m, "local_static_provisioner_volume_unresponsive", std::slice::from_ref(&label))
            .iter()
            .any(|l| l.ends_with(" 1")))
        .then_some(m)
    });
    eprintln!(
        "{:?}",
        metric_lines(&metrics, "local_static_provisioner_volume_unresponsive", std::slice::from_ref(&label))
    );
    let stuck = gauge(&metrics, "local_static_provisioner_host_operations_stuck");
    assert!(stuck.is_some_and(|n| n >= 1), "operations stuck: {stuck:?}");
    let ready = lab.agent().admin_get("/readyz");
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    assert!(ready.contains(&format!("unresponsive: {path} (")), "/readyz does not name the frozen volume: {ready}");
    let health = lab.agent().admin_get("/healthz");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");

    // A volume mounted meanwhile is published at once: nothing waits for the frozen one.
    let mounted = Instant::now();
    lab.tmpfs(&fs_dir.join("c"), 16);
    let c = pv_name("c", node, class);
    wait_until("the later volume's PV", WAIT, || available(&cp, &c));
    let latency = mounted.elapsed();
    eprintln!("a tmpfs mounted while a volume is frozen: its PV Available after {latency:?}");
    assert!(latency < Duration::from_secs(5), "the later volume took {latency:?}");
    assert!(cp.pv_state(&f).is_none(), "the frozen volume was published");

    // Thawed: it answers again and is published by itself (no resync, no new event of ours).
    let thawed = Instant::now();
    lab.thaw(&frozen);
    wait_until("the thawed volume's PV", Duration::from_secs(20), || available(&cp, &f));
    eprintln!("the thawed volume's PV Available {:?} after the thaw", thawed.elapsed());
    wait_until("the unresponsive metric and readiness cleared", WAIT, || {
        let m = lab.agent().admin_get("/metrics");
        let r = lab.agent().admin_get("/readyz");
        (metric_lines(&m, "local_static_provisioner_volume_unresponsive", std::slice::from_ref(&label)).is_empty()
            && gauge(&m, "local_static_provisioner_host_operations_stuck") == Some(0)
            && r.starts_with("HTTP/1.1 200")
            && !r.contains("unresponsive"))
        .then_some(())
    });
    assert_eq!(cp.pvs_under(&fs_dir.display().to_string()).len(), 4);
}

#[test]
fn frozen_released_volume_wipe_hangs_others_recycle() {
    let _area = support::area(module_path!());
    if !require_root("frozen_released_volume_wipe_hangs_others_recycle") {
        return;
    }
    let cp = ControlPlane::get();
    let (node, class) = (&unique("fd-frozen-wipe-node"), &unique("fd-frozen-wipe"));
    cp.create_node(node);
    cp.create_storage_class(class, "Delete");
    let mut lab = Lab::new("fd-frozen-wipe");
    let fs_dir = lab.root.join("fs");
    let (healthy, wedged) = (fs_dir.join("healthy"), fs_dir.join("wedged"));
    lab.tmpfs(&healthy, 32);
    lab.ext4(&wedged, 64, "defaults");
    lab.start_agent(&cp, node, &class_map(class, &fs_dir));
    let (h, w) = (pv_name("healthy", node, class), pv_name("wedged", node, class));
    wait_until("both PVs Available", WAIT, || {
        (available(&cp, &h).is_some() && available(&cp, &w).is_some()).then_some(())
    });

    let (claim1, claim2) = (unique("fd-wipe-1"), unique("fd-wipe-2"));
    let mut bound = [cp.bind_claim(&claim1, class, false), cp.bind_claim(&claim2, class, false)];
    bound.sort();
    let mut both = [h.clone(), w.clone()];
    both.sort();
    assert_eq!(bound, both, "each claim bound one of the two PVs");
    let (h_uid, _) = cp.pv_state(&h).unwrap();
    let (w_uid, _) = cp.pv_state(&w).unwrap();
    std::fs::write(healthy.join("tenant-data"), vec![7u8; 1 << 20]).unwrap();
    std::fs::write(wedged.join("tenant-data"), vec![7u8; 1 << 20]).unwrap();
    std::fs::create_dir_all(wedged.join("dir/sub")).unwrap();
    std::fs::write(wedged.join("dir/sub/more"), b"x").unwrap();
    lab.freeze(&wedged);

    cp.release_claim(&claim1);
    cp.release_claim(&claim2);
    let released = Instant::now();
    wait_recycled(&cp, &h, &h_uid, Some(&healthy), WAIT);
    eprintln!("the healthy volume recycled {:?} after the release (the other one frozen)", released.elapsed());

    let mounted = Instant::now();
    lab.tmpfs(&fs_dir.join("late"), 16);
    let late = pv_name("late", node, class);
    wait_until("the later volume's PV", WAIT, || available(&cp, &late));
    let latency = mounted.elapsed();
    eprintln!("a tmpfs mounted while a released volume is frozen: its PV Available after {latency:?}");
    assert!(latency < Duration::from_secs(5), "the later volume took {latency:?}");

    // The frozen one is neither offered nor deleted: its PV waits, Released, with its data.
    std::thread::sleep(Duration::from_secs(3));
    let (uid, phase) = cp.pv_state(&w).expect("the frozen volume's PV must stay");
    assert_eq!((uid.as_str(), phase.as_str()), (w_uid.as_str(), "Released"), "the frozen volume's PV");
    assert!(
        lab.agent().log_text().contains(&format!("starting wipe pv={w} ")),
        "the frozen volume's wipe was never started"
    );

    let thawed = Instant::now();
    lab.thaw(&wedged);
    wait_recycled(&cp, &w, &w_uid, Some(&wedged), WAIT);
    eprintln!("the thawed volume wiped and recycled {:?} after the thaw", thawed.elapsed());
    assert!(std::fs::read_dir(&wedged).unwrap().next().is_none(), "the recycled volume is empty");
    wait_until("the unresponsive metric cleared", WAIT, || {
        let m = lab.agent().admin_get("/metrics");
        metric_lines(&m, "local_static_provisioner_volume_unresponsive", &[]).is_empty().then_some(())
    });
}

#[test]
fn read_only_remount_withdraws_the_available_pv_and_returns_it() {
    let _area = support::area(module_path!());
    if !require_root("read_only_remount_withdraws_the_available_pv_and_returns_it") {
        return;
    }
    let cp = ControlPlane::get();
    let (node, class) = (&unique("fd-ro-node"), &unique("fd-ro"));
    cp.create_node(node);
    cp.create_storage_class(class, "Delete");
    let mut lab = Lab::new("fd-ro");
    let fs_dir = lab.root.join("fs");
    let vol = fs_dir.join("vol");
    lab.tmpfs(&vol, 16);
    lab.start_agent(&cp, node, &class_map(class, &fs_dir));
    let name = pv_name("vol", node, class);
    let first_uid = wait_until("PV published", WAIT, || available(&cp, &name));

    run(Command::new("mount").args(["-o", "remount,ro"]).arg(&vol));
    let remounted = Instant::now();
    wait_until("the PV withdrawn", Duration::from_secs(10), || cp.pv_state(&name).is_none().then_some(()));
    eprintln!("the Available PV withdrawn {:?} after the read-only remount", remounted.elapsed());
    wait_until("VolumeWithdrawn event", WAIT, || cp.has_event(&name, "VolumeWithdrawn", "read-only").then_some(()));
    let path = vol.display().to_string();
    let failing = wait_until("the read-only sign in the metrics", WAIT, || {
        let m = lab.agent().admin_get("/metrics");
        let lines = metric_lines(
            &m,
            "local_static_provisioner_volume_failing",
            &[format!("path=\"{path}\""), "reason=\"read-only\"".to_string()],
        )
        .iter()
        .map(|l| l.to_string())
        .collect::<Vec<_>>();
        (!lines.is_empty()).then_some(lines)
    });
    eprintln!("{failing:?}");
    // Not offered again while read-only.
    std::thread::sleep(Duration::from_secs(3));
    assert!(cp.pv_state(&name).is_none(), "a read-only volume was published again");

    run(Command::new("mount").args(["-o", "remount,rw"]).arg(&vol));
    let back = Instant::now();
    let uid = wait_until("the PV published again", WAIT, || available(&cp, &name));
    eprintln!("published again {:?} after the read-write remount", back.elapsed());
    assert_ne!(uid, first_uid, "a new PV");
    wait_until("the failing metric cleared", WAIT, || {
        let m = lab.agent().admin_get("/metrics");
        metric_lines(&m, "local_static_provisioner_volume_failing", &[format!("path=\"{path}\"")])
            .is_empty()
            .then_some(())
    });
}

#[test]
fn ext4_errors_on_a_bound_volume_tell_the_claim() {
    let _area = support::area(module_path!());
    if !require_root("ext4_errors_on_a_bound_volume_tell_the_claim") {
        return;
    }
    let cp = ControlPlane::get();
    let (node, class, claim) = (&unique("fd-errors-node"), &unique("fd-errors"), &unique("fd-errors-claim"));
    cp.create_node(node);
    cp.create_storage_class(class, "Delete");
    let mut lab = Lab::new("fd-errors");
    let fs_dir = lab.root.join("fs");
    let vol = fs_dir.join("vol");
    let dev = lab.ext4(&vol, 64, "errors=continue");
    // An ext4 error that does not remount changes no mount and no device: the agent's watch of
    // the failing signs (every 2 s) wakes the pass (see ext4_errors_on_an_idle_node_are_seen_without_a_resync).
    lab.start_agent(&cp, node, &class_map(class, &fs_dir));
    let name = pv_name("vol", node, class);
    let uid = wait_until("PV published", WAIT, || available(&cp, &name));
    assert_eq!(cp.bind_claim(claim, class, false), name);
    std::fs::write(vol.join("tenant-data"), b"tenant").unwrap();

    trigger_ext4_error(&dev);
    let triggered = Instant::now();

    let value = wait_until("the disk-failing annotation", Duration::from_secs(10), || {
        let pv = cp.get_json(&["pv", &name])?;
        pv["metadata"]["annotations"][ANN_DISK_FAILING].as_str().map(str::to_string)
    });
    eprintln!("annotated {:?} after the error: {value}", triggered.elapsed());
    assert!(value.contains("filesystem-errors"), "{value}");
    wait_until("Warning DiskFailing on the PV", Duration::from_secs(10), || {
        events_about(&cp, "PersistentVolume", &name, Some("DiskFailing"))
            .iter()
            .any(|e| e["type"] == "Warning")
            .then_some(())
    });
    let on_claim = wait_until("Warning DiskFailing on the claim", Duration::from_secs(10), || {
        let found = events_about(&cp, "PersistentVolumeClaim", claim, Some("DiskFailing"));
        found.into_iter().find(|e| e["type"] == "Warning")
    });
    assert_eq!(on_claim["regarding"]["namespace"], "default", "{on_claim:#}");
    assert_eq!(on_claim["related"]["kind"], "PersistentVolume", "{on_claim:#}");
    assert_eq!(on_claim["related"]["name"], name.as_str(), "{on_claim:#}");
    assert!(on_claim["note"].as_str().is_some_and(|n| n.contains("filesystem-errors")), "{on_claim:#}");
    let path = vol.display().to_string();
    let metrics = lab.agent().admin_get("/metrics");
    let failing = metric_lines(
        &metrics,
        "local_static_provisioner_volume_failing",
        &[format!("path=\"{path}\""), format!("pv=\"{name}\""), "reason=\"filesystem-errors\"".to_string()],
    );
    assert_eq!(failing.len(), 1, "{metrics}");
    // A bound PV is never deleted for it.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(cp.pv_state(&name), Some((uid.clone(), "Bound".to_string())), "the bound PV must stay");

    // Repaired: unmounted, e2fsck, mounted again at the same path.
    umount_when_idle(&vol);
    let out = Command::new("e2fsck").arg("-fy").arg(&dev).output().unwrap();
    assert!(matches!(out.status.code(), Some(0 | 1)), "e2fsck: {out:?}");
    mount_ext4(&dev, &vol, "errors=continue");
    let repaired = Instant::now();
    wait_until("the annotation removed", Duration::from_secs(15), || {
        let pv = cp.get_json(&["pv", &name])?;
        pv["metadata"]["annotations"][ANN_DISK_FAILING].is_null().then_some(())
    });
    wait_until("DiskRecovered on the claim", Duration::from_secs(15), || {
        let found = events_about(&cp, "PersistentVolumeClaim", claim, Some("DiskRecovered"));
        found.iter().any(|e| e["type"] == "Normal").then_some(())
    });
    eprintln!("unflagged and the claim told {:?} after the repaired volume was mounted", repaired.elapsed());
    assert!(!events_about(&cp, "PersistentVolume", &name, Some("DiskRecovered")).is_empty());
    assert_eq!(cp.pv_state(&name), Some((uid, "Bound".to_string())), "the bound PV must stay");
    assert_eq!(std::fs::read(vol.join("tenant-data")).unwrap(), b"tenant", "the tenant's data is untouched");
}

#[test]
fn stalled_wipe_gives_its_slot_back() {
    let _area = support::area(module_path!());
    if !require_root("stalled_wipe_gives_its_slot_back") {
        return;
    }
    let cp = ControlPlane::get();
    let (node, class) = (&unique("fd-stall-node"), &unique("fd-stall"));
    cp.create_node(node);
    cp.create_storage_class(class, "Delete");
    let mut lab = Lab::new("fd-stall");
    let fs_dir = lab.root.join("fs");
    let (healthy, wedged) = (fs_dir.join("healthy"), fs_dir.join("wedged"));
    lab.tmpfs(&healthy, 32);
    lab.ext4(&wedged, 64, "defaults");
    // One wipe slot: the healthy volume's wipe can only run once the frozen one gives it back.
    lab.start_agent_with(&cp, node, &class_map(class, &fs_dir), &["--wipe-concurrency", "1"]);
    let (h, w) = (pv_name("healthy", node, class), pv_name("wedged", node, class));
    wait_until("both PVs Available", WAIT, || {
        (available(&cp, &h).is_some() && available(&cp, &w).is_some()).then_some(())
    });
    let (claim1, claim2) = (unique("fd-stall-1"), unique("fd-stall-2"));
    let first = cp.bind_claim(&claim1, class, false);
    let second = cp.bind_claim(&claim2, class, false);
    let (w_claim, h_claim) = if first == w { (&claim1, &claim2) } else { (&claim2, &claim1) };
    assert_eq!([first.as_str(), second.as_str()].iter().filter(|n| **n == w.as_str()).count(), 1);
    let (h_uid, _) = cp.pv_state(&h).unwrap();
    let (w_uid, _) = cp.pv_state(&w).unwrap();
    std::fs::write(healthy.join("tenant-data"), b"tenant").unwrap();
    std::fs::write(wedged.join("tenant-data"), b"tenant").unwrap();
    lab.freeze(&wedged);

    // The frozen volume's wipe takes the only slot, then the healthy one is released.
    cp.release_claim(w_claim);
    wait_until("the frozen volume's wipe started", WAIT, || {
        lab.agent().log_text().contains(&format!("starting wipe pv={w} ")).then_some(())
    });
    let stalled_from = Instant::now();
    cp.release_claim(h_claim);
    wait_until("VolumeUnresponsive on the frozen volume's PV", Duration::from_secs(90), || {
        cp.has_event(&w, "VolumeUnresponsive", "no progress").then_some(())
    });
    eprintln!("VolumeUnresponsive {:?} after the frozen volume's wipe started", stalled_from.elapsed());
    wait_recycled(&cp, &h, &h_uid, Some(&healthy), Duration::from_secs(30));
    let took = stalled_from.elapsed();
    eprintln!("the healthy volume recycled {took:?} after its release (one slot, held by a stalled wipe)");

    // The stalled one is unresponsive (metrics, readiness) and its PV waits, Released.
    let path = wedged.display().to_string();
    let label = format!("path=\"{path}\"");
    let stalls = wait_until("the frozen volume in the unresponsive metric", WAIT, || {
        let m = lab.agent().admin_get("/metrics");
        let lines: Vec<String> =
            metric_lines(&m, "local_static_provisioner_volume_unresponsive", std::slice::from_ref(&label))
                .iter()
                .map(|l| l.to_string())
                .collect();
        (!lines.is_empty()).then_some(lines)
    });
    eprintln!("{stalls:?}");
    let ready = lab.agent().admin_get("/readyz");
    assert!(ready.starts_with("HTTP/1.1 200") && ready.contains(&format!("unresponsive: {path} (")), "{ready}");
    assert!(lab.agent().admin_get("/healthz").starts_with("HTTP/1.1 200"));
    assert_eq!(cp.pv_state(&w), Some((w_uid.clone(), "Released".to_string())), "the frozen volume's PV");

    let thawed = Instant::now();
    lab.thaw(&wedged);
    wait_recycled(&cp, &w, &w_uid, Some(&wedged), WAIT);
    eprintln!("the thawed volume wiped and recycled {:?} after the thaw", thawed.elapsed());
    wait_until("the unresponsive metric cleared", WAIT, || {
        let m = lab.agent().admin_get("/metrics");
        metric_lines(&m, "local_static_provisioner_volume_unresponsive", &[]).is_empty().then_some(())
    });
}

/// An ext4 error on an idle node, the two ways ext4 reacts to one: `errors=continue` (mkfs's
/// default) only counts it; `errors=remount-ro` also makes the superblock read-only, a change
/// the kernel makes itself and does not announce in the mount table. Neither changes a mount or
/// a device: the agent's watch of the failing signs (every 2 s, host::mounts::watch) wakes a pass, so
/// both Available PVs are withdrawn within seconds, not at the next resync (5 to 10 min). On a
/// busy host it could pass by chance (any mount anywhere wakes a pass); on an idle one it failed
/// before that watch.
#[test]
fn ext4_errors_on_an_idle_node_are_seen_without_a_resync() {
    let _area = support::area(module_path!());
    if !require_root("ext4_errors_on_an_idle_node_are_seen_without_a_resync") {
        return;
    }
    let cp = ControlPlane::get();
    let (node, class) = (&unique("fd-idle-node"), &unique("fd-idle"));
    cp.create_node(node);
    cp.create_storage_class(class, "Delete");
    let mut lab = Lab::new("fd-idle");
    let fs_dir = lab.root.join("fs");
    let counting = lab.ext4(&fs_dir.join("counting"), 64, "errors=continue");
    let remounting = lab.ext4(&fs_dir.join("remounting"), 64, "errors=remount-ro");
    lab.start_agent(&cp, node, &class_map(class, &fs_dir));
    let names = [pv_name("counting", node, class), pv_name("remounting", node, class)];
    wait_until("both PVs Available", WAIT, || names.iter().all(|n| available(&cp, n).is_some()).then_some(()));
    wait_idle(lab.agent());

    trigger_ext4_error(&counting);
    trigger_ext4_error(&remounting);
    let triggered = Instant::now();
    let deadline = Duration::from_secs(15);
    while triggered.elapsed() < deadline && names.iter().any(|n| cp.pv_state(n).is_some()) {
        std::thread::sleep(Duration::from_millis(200));
    }
    let left: Vec<&String> = names.iter().filter(|n| cp.pv_state(n).is_some()).collect();
    let log = lab.agent().log_text();
    let resync = log.lines().rfind(|l| l.contains("periodic resync")).unwrap_or("no resync line");
    assert!(
        left.is_empty(),
        "{deadline:?} after ext4 errors on an idle node, the Available PVs {left:?} are still offered \
         (counting: {}, remounting: {}); the agent's last resync line: {resync}",
        names[0],
        names[1]
    );
}

/// A volume whose every access blocks, even `stat` and `statfs` (a FUSE daemon stopped: a hung
/// NFS server or storage daemon looks the same): discovery, the presence check and every pass
/// go on without it; a volume mounted meanwhile is published at once; its PV (if it had one)
/// is kept; once the daemon runs again it is seen again.
#[test]
fn a_volume_whose_every_access_blocks_costs_only_itself() {
    let _area = support::area(module_path!());
    if !require_root("a_volume_whose_every_access_blocks_costs_only_itself") {
        return;
    }
    if !support::quiet(Command::new("bindfs").arg("--version")) {
        return support::cannot_run("a_volume_whose_every_access_blocks_costs_only_itself", "bindfs is not installed");
    }
    let cp = ControlPlane::get();
    let (node, class) = (&unique("fd-fuse-node"), &unique("fd-fuse"));
    cp.create_node(node);
    cp.create_storage_class(class, "Delete");
    let mut lab = Lab::new("fd-fuse");
    let fs_dir = lab.root.join("fs");
    lab.tmpfs(&fs_dir.join("a"), 16);
    let hung = lab.fuse(&fs_dir.join("hung"));
    lab.start_agent(&cp, node, &class_map(class, &fs_dir));
    let (a, b, h) = (pv_name("a", node, class), pv_name("b", node, class), pv_name("hung", node, class));
    wait_until("the healthy PV", WAIT, || available(&cp, &a));
    wait_idle(lab.agent());
    let hung_pv = cp.pv_state(&h);
    eprintln!("the FUSE volume's PV before its daemon stops: {hung_pv:?}");

    lab.stop_fuse(hung, true);
    let stopped = Instant::now();
    lab.tmpfs(&fs_dir.join("b"), 16);
    wait_until("a volume mounted while another hangs", WAIT, || available(&cp, &b));
    let latency = stopped.elapsed();
    eprintln!("a tmpfs mounted while a FUSE volume hangs: its PV Available after {latency:?}");
    assert!(latency < Duration::from_secs(5), "the later volume took {latency:?}");
    let label = format!("path=\"{}\"", fs_dir.join("hung").display());
    wait_until("the hung volume reported unresponsive", WAIT, || {
        let m = lab.agent().admin_get("/metrics");
        (!metric_lines(&m, "local_static_provisioner_volume_unresponsive", std::slice::from_ref(&label)).is_empty())
            .then_some(())
    });
    let health = lab.agent().admin_get("/healthz");
    assert!(health.starts_with("HTTP/1.1 200"), "a hung volume never fails the liveness probe: {health}");
    let stuck = gauge(&lab.agent().admin_get("/metrics"), "local_static_provisioner_host_operations_stuck");
    assert!(stuck.is_some_and(|n| (1..=4).contains(&n)), "a bounded number of stuck threads: {stuck:?}");
    // Passes go on (the tmpfs above, and one more), and do not add stuck threads.
    lab.tmpfs(&fs_dir.join("c"), 16);
    wait_until("another volume", WAIT, || available(&cp, &pv_name("c", node, class)));
    let again = gauge(&lab.agent().admin_get("/metrics"), "local_static_provisioner_host_operations_stuck");
    assert_eq!(again, stuck, "later passes start no new operation on the hung volume");
    if let Some((uid, _)) = &hung_pv {
        let kept = cp.pv_state(&h).expect("the hung volume's PV is kept");
        assert_eq!(&kept.0, uid, "and not replaced");
        let pv = cp.get_json(&["pv", &h]).unwrap();
        assert!(
            pv["metadata"]["annotations"]["local-static-provisioner.io/volume-missing"].is_null(),
            "nor flagged missing"
        );
    }

    lab.stop_fuse(hung, false);
    wait_until("the unresponsive metric cleared", WAIT, || {
        let m = lab.agent().admin_get("/metrics");
        metric_lines(&m, "local_static_provisioner_volume_unresponsive", &[]).is_empty().then_some(())
    });
    assert_eq!(cp.pv_state(&h).map(|(u, _)| u), hung_pv.map(|(u, _)| u), "its PV as it was");
}

/// A class whose discovery directory itself hangs (a FUSE filesystem mounted there whose daemon
/// stopped: a hung NFS export looks the same) sits the passes out; the other class's volumes are
/// published as usual, and the liveness probe stays green.
#[test]
fn a_discovery_directory_that_hangs_costs_only_its_class() {
    let _area = support::area(module_path!());
    if !require_root("a_discovery_directory_that_hangs_costs_only_its_class") {
        return;
    }
    if !support::quiet(Command::new("bindfs").arg("--version")) {
        return support::cannot_run("a_discovery_directory_that_hangs_costs_only_its_class", "bindfs is not installed");
    }
    let cp = ControlPlane::get();
    let (node, good, hung) = (&unique("fd-dir-node"), &unique("fd-dir-good"), &unique("fd-dir-hung"));
    cp.create_node(node);
    cp.create_storage_class(good, "Delete");
    cp.create_storage_class(hung, "Delete");
    let mut lab = Lab::new("fd-dir");
    let (good_dir, hung_dir) = (lab.root.join("good"), lab.root.join("hung"));
    lab.tmpfs(&good_dir.join("a"), 16);
    let daemon = lab.fuse(&hung_dir);
    let map = format!("{}{}", class_map(good, &good_dir), class_map(hung, &hung_dir));
    lab.start_agent(&cp, node, &map);
    wait_until("the good class's PV", WAIT, || available(&cp, &pv_name("a", node, good)));
    wait_idle(lab.agent());

    lab.stop_fuse(daemon, true);
    let stopped = Instant::now();
    lab.tmpfs(&good_dir.join("b"), 16);
    wait_until("a volume of the good class mounted meanwhile", WAIT, || available(&cp, &pv_name("b", node, good)));
    let latency = stopped.elapsed();
    eprintln!("a tmpfs mounted while another class's directory hangs: its PV Available after {latency:?}");
    assert!(latency < Duration::from_secs(5), "the later volume took {latency:?}");
    let label = format!("path=\"{}\"", hung_dir.display());
    wait_until("the hung directory reported unresponsive", WAIT, || {
        let m = lab.agent().admin_get("/metrics");
        (!metric_lines(&m, "local_static_provisioner_volume_unresponsive", std::slice::from_ref(&label)).is_empty())
            .then_some(())
    });
    let health = lab.agent().admin_get("/healthz");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    lab.tmpfs(&good_dir.join("c"), 16);
    wait_until("passes go on", WAIT, || available(&cp, &pv_name("c", node, good)));

    lab.stop_fuse(daemon, false);
    wait_until("the unresponsive metric cleared", WAIT, || {
        let m = lab.agent().admin_get("/metrics");
        metric_lines(&m, "local_static_provisioner_volume_unresponsive", &[]).is_empty().then_some(())
    });
}

/// Polls `/healthz` every 200 ms for `span`: every answer must be 200 (a wedged directory or
/// file never makes the liveness probe restart the pod into the same hang).
fn healthy_throughout(agent: &AgentProcess, span: Duration) {
    let until = Instant::now() + span;
    while Instant::now() < until {
        let health = agent.admin_get("/healthz");
        assert!(health.starts_with("HTTP/1.1 200"), "liveness failed: {health}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A discovery directory whose FUSE daemon is stopped, with a tmpfs volume inside it mounted
/// before it stopped: `(daemon index, the directory)`.
fn wedged_directory(lab: &mut Lab, name: &str) -> (usize, PathBuf) {
    let dir = lab.root.join(name);
    let daemon = lab.fuse(&dir);
    lab.tmpfs(&dir.join("x"), 16);
    lab.stop_fuse(daemon, true);
    (daemon, dir)
}

/// Waits until the metrics name `dir` as unresponsive.
fn reported_unresponsive(agent: &AgentProcess, dir: &Path) {
    let label = format!("path=\"{}\"", dir.display());
    wait_until("the wedged directory reported unresponsive", WAIT, || {
        let m = agent.admin_get("/metrics");
        (!metric_lines(&m, "local_static_provisioner_volume_unresponsive", std::slice::from_ref(&label)).is_empty())
            .then_some(())
    });
}

/// Issue 41: a discovery directory already wedged when the agent starts (its FUSE daemon
/// stopped; the agent restarted onto it). Adding its watch blocks in the kernel: that now
/// runs under the executor's deadline, so the first pass and every later one complete, the
/// other class's volumes are published within seconds, and `/healthz` stays 200. Once the
/// daemon runs again the directory's watch and its class's volumes follow.
#[test]
fn a_discovery_directory_wedged_at_start_costs_only_its_class() {
    let _area = support::area(module_path!());
    let name = "a_discovery_directory_wedged_at_start_costs_only_its_class";
    if !require_root(name) {
        return;
    }
    if !support::quiet(Command::new("bindfs").arg("--version")) {
        return support::cannot_run(name, "bindfs is not installed");
    }
    let cp = ControlPlane::get();
    let (node, good, hung) = (&unique("fd-wstart-node"), &unique("fd-wstart-good"), &unique("fd-wstart-hung"));
    cp.create_node(node);
    cp.create_storage_class(good, "Delete");
    cp.create_storage_class(hung, "Delete");
    let mut lab = Lab::new("fd-wstart");
    let good_dir = lab.root.join("good");
    lab.tmpfs(&good_dir.join("a"), 16);
    let (daemon, hung_dir) = wedged_directory(&mut lab, "hung");
    let map = format!("{}{}", class_map(good, &good_dir), class_map(hung, &hung_dir));
    let started = Instant::now();
    lab.start_agent(&cp, node, &map);
    wait_until("the good class's PV", WAIT, || available(&cp, &pv_name("a", node, good)));
    let latency = started.elapsed();
    eprintln!("agent started beside a wedged discovery directory: the other class's PV Available after {latency:?}");
    assert!(latency < Duration::from_secs(15), "the healthy class took {latency:?}");
    reported_unresponsive(lab.agent(), &hung_dir);
    assert!(
        cp.pv_state(&pv_name("x", node, hung)).is_none(),
        "nothing published from a directory that does not answer"
    );
    // Passes go on: a volume mounted now is published within seconds, liveness green throughout.
    let mounted = Instant::now();
    lab.tmpfs(&good_dir.join("b"), 16);
    wait_until("a volume mounted meanwhile", WAIT, || available(&cp, &pv_name("b", node, good)));
    assert!(mounted.elapsed() < Duration::from_secs(5), "the later volume took {:?}", mounted.elapsed());
    healthy_throughout(lab.agent(), Duration::from_secs(8));

    lab.stop_fuse(daemon, false);
    wait_until("the wedged class's volume once its directory answers", WAIT, || {
        available(&cp, &pv_name("x", node, hung))
    });
    // Its directory is watched now: a volume mounted there is published without a resync.
    lab.tmpfs(&hung_dir.join("y"), 16);
    wait_until("a volume of the recovered class", Duration::from_secs(20), || {
        available(&cp, &pv_name("y", node, hung))
    });
    let health = lab.agent().admin_get("/healthz");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
}

/// Issue 41: the same with the wedged directory's class added by a config reload.
#[test]
fn a_wedged_discovery_directory_added_by_a_reload_costs_only_its_class() {
    let _area = support::area(module_path!());
    let name = "a_wedged_discovery_directory_added_by_a_reload_costs_only_its_class";
    if !require_root(name) {
        return;
    }
    if !support::quiet(Command::new("bindfs").arg("--version")) {
        return support::cannot_run(name, "bindfs is not installed");
    }
    let cp = ControlPlane::get();
    let (node, good, hung) = (&unique("fd-wreload-node"), &unique("fd-wreload-good"), &unique("fd-wreload-hung"));
    cp.create_node(node);
    cp.create_storage_class(good, "Delete");
    cp.create_storage_class(hung, "Delete");
    let mut lab = Lab::new("fd-wreload");
    let good_dir = lab.root.join("good");
    lab.tmpfs(&good_dir.join("a"), 16);
    lab.start_agent(&cp, node, &class_map(good, &good_dir));
    wait_until("the good class's PV", WAIT, || available(&cp, &pv_name("a", node, good)));
    wait_idle(lab.agent());

    let (daemon, hung_dir) = wedged_directory(&mut lab, "hung");
    let map = format!("{}{}", class_map(good, &good_dir), class_map(hung, &hung_dir));
    write_config(&lab.root.join("config"), &[("storageClassMap", &map)]);
    wait_until("the reload", WAIT, || lab.agent().log_text().contains("configuration reloaded").then_some(()));
    reported_unresponsive(lab.agent(), &hung_dir);
    let mounted = Instant::now();
    lab.tmpfs(&good_dir.join("b"), 16);
    wait_until("a volume mounted after the reload", WAIT, || available(&cp, &pv_name("b", node, good)));
    let latency = mounted.elapsed();
    eprintln!("a tmpfs mounted after a reload added a wedged directory: its PV Available after {latency:?}");
    assert!(latency < Duration::from_secs(5), "the later volume took {latency:?}");
    healthy_throughout(lab.agent(), Duration::from_secs(8));

    lab.stop_fuse(daemon, false);
    wait_until("the added class's volume once its directory answers", WAIT, || {
        available(&cp, &pv_name("x", node, hung))
    });
}

/// Issue 41: a process holding open a file of a FUSE filesystem whose daemon stopped (a hung
/// NFS mount looks the same), that filesystem being a published volume, beside a class that
/// claims loop devices. Neither the scan of every process's descriptors that a claim needs
/// (the link is read first, the file looked at without a sync, under the executor's deadline)
/// nor the claim rules' look at each PV's path asks the hung filesystem: a healthy volume and
/// a blank unused device that show up meanwhile are published within seconds, a device another
/// process holds open is not, and `/healthz` stays 200.
#[test]
fn a_process_holding_a_hung_file_does_not_stop_the_passes_nor_prove_a_device_unused() {
    let _area = support::area(module_path!());
    let name = "a_process_holding_a_hung_file_does_not_stop_the_passes_nor_prove_a_device_unused";
    if !require_root(name) {
        return;
    }
    if !support::quiet(Command::new("bindfs").arg("--version")) {
        return support::cannot_run(name, "bindfs is not installed");
    }
    const MIB: u64 = 51;
    let cp = ControlPlane::get();
    let (node, fs_class, dev_class) = (&unique("fd-hfile-node"), &unique("fd-hfile-fs"), &unique("fd-hfile-dev"));
    cp.create_node(node);
    cp.create_storage_class(fs_class, "Delete");
    cp.create_storage_class(dev_class, "Delete");
    let mut lab = Lab::new("fd-hfile");
    let fs_dir = lab.root.join("fs");
    lab.tmpfs(&fs_dir.join("a"), 16);
    // A FUSE volume of the class, with a file held open (as stdin) by a process of its own.
    let daemon = lab.fuse(&fs_dir.join("hung"));
    std::fs::write(fs_dir.join("hung").join("held"), b"x").unwrap();
    let holder = Killed(
        Command::new("sleep")
            .arg("600")
            .stdin(std::fs::File::open(fs_dir.join("hung").join("held")).unwrap())
            .spawn()
            .unwrap(),
    );
    // Blank loop devices of a size no other test uses: one free, one held open by a process.
    let (free, busy) = (lab.blank_loop("free", MIB), lab.blank_loop("busy", MIB));
    let busy_holder =
        Killed(Command::new("sleep").arg("600").stdin(std::fs::File::open(&busy).unwrap()).spawn().unwrap());
    let claims_dir = lab.root.join("claims");
    std::fs::create_dir_all(&claims_dir).unwrap();
    let section =
        format!("  volumeMode: Block\n  devices:\n    types: [loop]\n    minSize: {MIB}Mi\n    maxSize: {MIB}Mi\n");
    let map = format!("{}{}{section}", class_map(fs_class, &fs_dir), class_map(dev_class, &claims_dir));
    lab.start_agent(&cp, node, &map);
    wait_until("the healthy volume's PV", WAIT, || available(&cp, &pv_name("a", node, fs_class)));
    wait_until("the FUSE volume's PV", WAIT, || available(&cp, &pv_name("hung", node, fs_class)));
    let linked = |dev: &Path| {
        std::fs::read_dir(&claims_dir)
            .unwrap()
            .flatten()
            .any(|e| std::fs::canonicalize(e.path()).is_ok_and(|t| t == dev))
    };
    wait_until("the free device claimed", WAIT, || linked(&free).then_some(()));
    wait_idle(lab.agent());

    lab.stop_fuse(daemon, true);
    // Past bindfs's attribute cache: an ordinary stat of the held file now blocks.
    std::thread::sleep(Duration::from_secs(2));
    let stopped = Instant::now();
    let later = lab.blank_loop("later", MIB);
    lab.tmpfs(&fs_dir.join("b"), 16);
    wait_until("a volume mounted meanwhile", WAIT, || available(&cp, &pv_name("b", node, fs_class)));
    wait_until("a device attached meanwhile, claimed", WAIT, || linked(&later).then_some(()));
    let latency = stopped.elapsed();
    eprintln!("with a hung file held open: a new volume and a new device published after {latency:?}");
    assert!(latency < Duration::from_secs(10), "took {latency:?}");
    let prefix = claims_dir.display().to_string();
    wait_until("the later device's PV", WAIT, || (cp.pvs_under(&prefix).len() == 2).then_some(()));
    healthy_throughout(lab.agent(), Duration::from_secs(5));
    assert!(!linked(&busy), "the device another process holds open is not claimed");
    assert_eq!(cp.pvs_under(&prefix).len(), 2, "only the free devices are published");
    drop(busy_holder);
    lab.stop_fuse(daemon, false);
    drop(holder);
}

/// A child process killed (by its PID) and reaped when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Resizes the image `name` of this lab to `mib` MiB and tells its loop device (`losetup -c`).
fn resize_image(lab: &Lab, name: &str, dev: &Path, mib: u64) {
    run(Command::new("truncate").arg("-s").arg(format!("{mib}M")).arg(lab.root.join("images").join(name)));
    run(Command::new("losetup").arg("-c").arg(dev));
}

/// Issue 41: a size change is a fact. An ext4 filesystem of 64 MiB whose loop device shrank to
/// 32 MiB under its Available PV: the PV is withdrawn (the sign `shrunk`) and not published
/// again while the filesystem is larger than its device. A Block PV, Bound, whose device
/// shrank to half: annotated, Warning `DiskFailing` on the PV and the claim, never deleted;
/// grown back past its capacity: the annotation removed (`DiskRecovered`) and the growth told
/// (Normal `VolumeGrown`), its capacity unchanged.
#[test]
fn shrunk_and_grown_disks_are_facts() {
    let _area = support::area(module_path!());
    if !require_root("shrunk_and_grown_disks_are_facts") {
        return;
    }
    let cp = ControlPlane::get();
    let node = &unique("fd-size-node");
    let (fs_class, block_class, claim) = (&unique("fd-size-fs"), &unique("fd-size-block"), &unique("fd-size-claim"));
    cp.create_node(node);
    cp.create_storage_class(fs_class, "Delete");
    cp.create_storage_class(block_class, "Delete");
    let mut lab = Lab::new("fd-size");
    let fs_dir = lab.root.join("fs");
    let block_dir = lab.root.join("block");
    std::fs::create_dir_all(&block_dir).unwrap();
    let fs_dev = lab.ext4(&fs_dir.join("vol"), 64, "defaults");
    let img = lab.root.join("images").join("blk");
    run(Command::new("truncate").arg("-s").arg("64M").arg(&img));
    let out = run(Command::new("losetup").args(["--find", "--show"]).arg(&img));
    let block_dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    lab.loops.push(block_dev.clone());
    std::os::unix::fs::symlink(&block_dev, block_dir.join("blk")).unwrap();
    let classes =
        format!("{}{}  volumeMode: Block\n", class_map(fs_class, &fs_dir), class_map(block_class, &block_dir));
    lab.start_agent(&cp, node, &classes);
    let (fs_pv, block_pv) = (pv_name("vol", node, fs_class), pv_name("blk", node, block_class));
    wait_until("both PVs Available", WAIT, || {
        (available(&cp, &fs_pv).is_some() && available(&cp, &block_pv).is_some()).then_some(())
    });
    assert_eq!(capacity(&cp, &block_pv).as_deref(), Some("64Mi"));
    assert_eq!(cp.bind_claim(claim, block_class, true), block_pv);
    let (block_uid, _) = cp.pv_state(&block_pv).unwrap();

    // Both disks shrink to 32 MiB.
    resize_image(&lab, "vol", &fs_dev, 32);
    resize_image(&lab, "blk", &block_dev, 32);
    let shrunk = Instant::now();
    wait_until("the Available PV on the shrunk filesystem withdrawn", WAIT, || {
        cp.pv_state(&fs_pv).is_none().then_some(())
    });
    eprintln!("the Available PV withdrawn {:?} after its device shrank", shrunk.elapsed());
    wait_until("VolumeWithdrawn says shrunk", WAIT, || cp.has_event(&fs_pv, "VolumeWithdrawn", "shrunk").then_some(()));
    let value = wait_until("the Bound PV annotated", WAIT, || {
        let pv = cp.get_json(&["pv", &block_pv])?;
        pv["metadata"]["annotations"][ANN_DISK_FAILING].as_str().map(str::to_string)
    });
    eprintln!("the Bound PV annotated {:?} after its device shrank: {value}", shrunk.elapsed());
    assert!(value.contains("shrunk: the volume is 32 MiB now, smaller than the 64 MiB its PV offers"), "{value}");
    let on_claim = wait_until("Warning DiskFailing on the claim", WAIT, || {
        events_about(&cp, "PersistentVolumeClaim", claim, Some("DiskFailing"))
            .into_iter()
            .find(|e| e["type"] == "Warning")
    });
    assert!(on_claim["note"].as_str().is_some_and(|n| n.contains("shrunk")), "{on_claim:#}");
    let path = block_dir.join("blk").display().to_string();
    let metrics = lab.agent().admin_get("/metrics");
    let labels = [format!("path=\"{path}\""), "reason=\"shrunk\"".to_string()];
    assert_eq!(metric_lines(&metrics, "local_static_provisioner_volume_failing", &labels).len(), 1, "{metrics}");
    // The shrunk filesystem is not offered again; the Bound PV is never deleted.
    std::thread::sleep(Duration::from_secs(3));
    assert!(cp.pv_state(&fs_pv).is_none(), "a filesystem larger than its device was published again");
    assert_eq!(cp.pv_state(&block_pv), Some((block_uid.clone(), "Bound".to_string())));
    assert!(lab.agent().log_text().contains("disk-failing"), "the skip of the shrunk filesystem says disk-failing");

    // The block device grows past the PV's capacity: recovered, the growth told, same capacity.
    resize_image(&lab, "blk", &block_dev, 128);
    let grown = Instant::now();
    wait_until("the annotation removed", WAIT, || {
        let pv = cp.get_json(&["pv", &block_pv])?;
        pv["metadata"]["annotations"][ANN_DISK_FAILING].is_null().then_some(())
    });
    let told = wait_until("VolumeGrown on the claim", WAIT, || {
        events_about(&cp, "PersistentVolumeClaim", claim, Some("VolumeGrown"))
            .into_iter()
            .find(|e| e["type"] == "Normal")
    });
    eprintln!("grown: unflagged and told {:?} after: {}", grown.elapsed(), told["note"]);
    assert!(told["note"].as_str().is_some_and(|n| n.contains("grew to 128 MiB (the PV offers 64 MiB)")), "{told:#}");
    assert!(!events_about(&cp, "PersistentVolume", &block_pv, Some("VolumeGrown")).is_empty());
    assert_eq!(capacity(&cp, &block_pv).as_deref(), Some("64Mi"), "a Bound PV's capacity is not changed");
    assert_eq!(cp.pv_state(&block_pv), Some((block_uid, "Bound".to_string())));
}

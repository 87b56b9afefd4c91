//! Issue 41: no number of wedged disks stops the healthy ones. A hundred frozen ext4 volumes
//! (`fsfreeze -f`, each its own loop device) beside healthy tmpfs ones, the agent started among
//! them: the healthy ones are published, a volume mounted later is published within 5 s, a
//! released one is recycled within 30 s, the threads the frozen ones hold are counted, and
//! after the thaw the threads go back down while memory stays flat. Needs root and the control
//! plane; prints the figures (threads, RSS, latencies).

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use local_static_provisioner::core::volumes::naming::pv_name;
use support::agent_checks::{available, gauge, threads_and_rss};
use support::{
    AgentProcess, ControlPlane, quiet, remove_scratch_dir, require_root, run, wait_recycled, wait_until, write_config,
};

const WEDGED: usize = 100;
const WAIT: Duration = Duration::from_secs(120);

/// The scratch directory, its loop devices, frozen filesystems and agent; dropping it thaws
/// first (the agent's stuck threads cannot exit before), then stops the agent and cleans up.
struct Lab {
    root: PathBuf,
    loops: Vec<PathBuf>,
    frozen: Vec<PathBuf>,
    agent: Option<AgentProcess>,
    cp_dir: Option<PathBuf>,
}

impl Lab {
    fn new() -> Self {
        let root = tempfile::Builder::new().prefix("lsp-many-wedged-").tempdir().unwrap().keep();
        std::fs::create_dir_all(root.join("images")).unwrap();
        Lab { root, loops: Vec::new(), frozen: Vec::new(), agent: None, cp_dir: None }
    }

    fn ext4(&mut self, point: &Path) {
        let img = self.root.join("images").join(point.file_name().unwrap());
        run(Command::new("truncate").arg("-s").arg("8M").arg(&img));
        let out = run(Command::new("losetup").args(["--find", "--show"]).arg(&img));
        let dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        self.loops.push(dev.clone());
        run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&dev));
        std::fs::create_dir_all(point).unwrap();
        run(Command::new("mount").arg(&dev).arg(point));
    }

    fn tmpfs(&self, point: &Path) {
        std::fs::create_dir_all(point).unwrap();
        run(Command::new("mount").args(["-t", "tmpfs", "-o", "size=16m", "tmpfs"]).arg(point));
    }

    fn freeze(&mut self, point: &Path) {
        self.frozen.push(point.to_path_buf());
        run(Command::new("fsfreeze").arg("-f").arg(point));
    }

    fn thaw_all(&mut self) {
        for p in std::mem::take(&mut self.frozen) {
            run(Command::new("fsfreeze").arg("-u").arg(&p));
        }
    }

    fn agent(&self) -> &AgentProcess {
        self.agent.as_ref().expect("agent started")
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for p in std::mem::take(&mut self.frozen) {
            quiet(Command::new("fsfreeze").arg("-u").arg(&p));
        }
        if let Some(agent) = self.agent.take() {
            if std::thread::panicking() {
                let kept = std::env::temp_dir().join("many_wedged-agent.log");
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
        for dev in self.loops.iter().rev() {
            quiet(Command::new("losetup").arg("-d").arg(dev));
        }
        remove_scratch_dir(&self.root, "many_wedged");
    }
}

#[test]
fn a_hundred_frozen_volumes_leave_the_healthy_ones_published_and_recycled() {
    let _area = support::area(module_path!());
    if !require_root("a_hundred_frozen_volumes_leave_the_healthy_ones_published_and_recycled") {
        return;
    }
    let cp = ControlPlane::get();
    let pid = std::process::id();
    let (node, class) = (&format!("mw-node-{pid}"), &format!("mw-{pid}"));
    cp.create_node(node);
    cp.create_storage_class(class, "Delete");
    let mut lab = Lab::new();
    let fs_dir = lab.root.join("fs");
    for i in 0..WEDGED {
        lab.ext4(&fs_dir.join(format!("frozen{i:03}")));
    }
    lab.tmpfs(&fs_dir.join("healthy-a"));
    lab.tmpfs(&fs_dir.join("healthy-b"));
    for i in 0..WEDGED {
        lab.freeze(&fs_dir.join(format!("frozen{i:03}")));
    }

    // Started among them: the healthy volumes are published.
    let config = lab.root.join("config");
    write_config(
        &config,
        &[("storageClassMap", &format!("{class}:\n  hostDir: {d}\n  mountDir: {d}\n", d = fs_dir.display()))],
    );
    let kubeconfig = cp.agent_kubeconfig(&lab.root);
    let log = lab.root.join("agent.log");
    let started = Instant::now();
    lab.agent = Some(AgentProcess::start_with(&config, node, &kubeconfig, &log, &["--host-op-timeout", "2s"]));
    lab.cp_dir = Some(cp.dir.clone());
    let (a, b) = (pv_name("healthy-a", node, class), pv_name("healthy-b", node, class));
    wait_until("the healthy PVs", WAIT, || {
        (available(&cp, &a).is_some() && available(&cp, &b).is_some()).then_some(())
    });
    let first = started.elapsed();
    eprintln!("{WEDGED} frozen volumes: the healthy PVs Available {first:?} after the agent started");

    // A volume mounted later is published within 5 s.
    std::thread::sleep(Duration::from_secs(10));
    let mounted = Instant::now();
    lab.tmpfs(&fs_dir.join("late"));
    let late = pv_name("late", node, class);
    wait_until("the later volume's PV", WAIT, || available(&cp, &late));
    let latency = mounted.elapsed();
    let (threads, rss) = threads_and_rss(lab.agent().pid());
    eprintln!(
        "a tmpfs mounted among {WEDGED} frozen volumes: Available after {latency:?}; {threads} threads, {rss} KiB RSS"
    );
    assert!(latency < Duration::from_secs(5), "the later volume took {latency:?}");

    // A released healthy volume is recycled within 30 s.
    let claim = format!("mw-claim-{pid}");
    let bound = cp.bind_claim(&claim, class, false);
    let (uid, _) = cp.pv_state(&bound).unwrap();
    cp.release_claim(&claim);
    let released = Instant::now();
    wait_recycled(&cp, &bound, &uid, None, Duration::from_secs(30));
    eprintln!("a released healthy volume recycled {:?} after the release", released.elapsed());

    let metrics = lab.agent().admin_get("/metrics");
    let wedged = gauge(&metrics, "local_static_provisioner_wedged_threads");
    eprintln!(
        "wedged_threads {wedged:?}, cap reached {:?}",
        gauge(&metrics, "local_static_provisioner_wedged_threads_cap_reached")
    );
    assert!(wedged.is_some_and(|n| n >= 1), "no wedged thread counted: {wedged:?}");
    assert_eq!(gauge(&metrics, "local_static_provisioner_wedged_threads_cap_reached"), Some(0));

    // Memory stays flat while they stay frozen (passes keep coming).
    let (_, rss_before) = threads_and_rss(lab.agent().pid());
    std::thread::sleep(Duration::from_secs(60));
    let (threads_frozen, rss_after) = threads_and_rss(lab.agent().pid());
    eprintln!("over 60 s frozen: RSS {rss_before} -> {rss_after} KiB, {threads_frozen} threads");
    assert!(rss_after < rss_before + 2048, "RSS grew from {rss_before} to {rss_after} KiB in 60 s");

    // Thawed: the threads go back down while passes go on (not only after 10 s without any job).
    let thawed = Instant::now();
    lab.thaw_all();
    let threads = wait_until("the threads back down", Duration::from_secs(30), || {
        let (threads, _) = threads_and_rss(lab.agent().pid());
        (threads < 30).then_some(threads)
    });
    eprintln!("after the thaw: {threads} threads {:?} later (from {threads_frozen})", thawed.elapsed());
    std::thread::sleep(Duration::from_secs(15));
    let (settled, rss) = threads_and_rss(lab.agent().pid());
    eprintln!("15 s later: {settled} threads, {rss} KiB RSS");
}

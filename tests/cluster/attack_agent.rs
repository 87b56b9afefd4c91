//! Attacks on the RUNNING agent (real control plane, real tmpfs/ext4/XFS mounts and loop
//! devices, the agent under its ServiceAccount) by someone who can mount and write in the
//! discovery directories but cannot touch the agent. Constructions over time: races against
//! the identity check of a wipe, moves and remounts of bound volumes, binds of a subdirectory,
//! loop devices re-attached, nested mounts and symlinks appearing during a wipe.
//!
//! Invariants checked:
//! 1. a wipe only destroys data of the disk published under that PV, never through a symlink,
//!    never across into another mount, never the data of another PV's tenant;
//! 2. a disk that held a tenant's data is never offered again (Available PV) unwiped;
//! 3. nothing outside the discovery directories is published or wiped (a canary filesystem
//!    outside, checked at the end of every test).
//!
//! Tests that demonstrate a break fail on purpose, with every violation listed. Needs root.

use crate::support;

use std::cell::RefCell;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::libc;
use serde_json::Value;
use support::{AgentProcess, ControlPlane, quiet, remove_scratch_dir, run, umount_when_idle, wait_until, write_config};

const WAIT: Duration = Duration::from_secs(60);
const ANN_MISSING: &str = "local-static-provisioner.io/volume-missing";

// ---------------------------------------------------------------------------------------------
// The lab: a private mount of its own holding every mount, image and loop device of one test

#[derive(Debug)]
enum Undo {
    Unmount(PathBuf),
    Detach(PathBuf),
}

struct Lab {
    root: PathBuf,
    undo: RefCell<Vec<Undo>>,
    canary: RefCell<Option<(PathBuf, String)>>,
}

impl Lab {
    fn new(name: &str) -> Lab {
        static N: AtomicUsize = AtomicUsize::new(0);
        let root = PathBuf::from(format!(
            "/tmp/lsp-attack-{}-{}-{name}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&root).unwrap();
        let lab = Lab { root, undo: RefCell::new(Vec::new()), canary: RefCell::new(None) };
        // Private: nothing mounted here propagates, and `mount --move` works.
        lab.bind(&lab.root.clone(), &lab.root.clone());
        lab
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    fn dir(&self, rel: &str) -> PathBuf {
        let p = self.path(rel);
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    fn push(&self, u: Undo) {
        self.undo.borrow_mut().push(u);
    }

    fn tmpfs(&self, dst: &Path, mib: u64) -> PathBuf {
        std::fs::create_dir_all(dst).unwrap();
        run(Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"]).arg(dst));
        self.push(Undo::Unmount(dst.into()));
        dst.into()
    }

    fn bind(&self, src: &Path, dst: &Path) -> PathBuf {
        std::fs::create_dir_all(dst).unwrap();
        run(Command::new("mount").arg("--bind").arg(src).arg(dst));
        self.push(Undo::Unmount(dst.into()));
        run(Command::new("mount").arg("--make-private").arg(dst));
        dst.into()
    }

    fn mount_dev(&self, dev: &Path, dst: &Path) -> PathBuf {
        std::fs::create_dir_all(dst).unwrap();
        run(Command::new("mount").arg(dev).arg(dst));
        self.push(Undo::Unmount(dst.into()));
        dst.into()
    }

    fn umount(&self, path: &Path) {
        umount_when_idle(path);
        let mut undo = self.undo.borrow_mut();
        if let Some(i) = undo.iter().rposition(|u| matches!(u, Undo::Unmount(p) if p == path)) {
            undo.remove(i);
        }
    }

    /// `mount --move from to`; the clean-up entry follows the mount.
    fn move_mount(&self, from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        run(Command::new("mount").arg("--move").arg(from).arg(to));
        for u in self.undo.borrow_mut().iter_mut().rev() {
            if let Undo::Unmount(p) = u
                && p == from
            {
                *p = to.into();
                break;
            }
        }
    }

    /// A loop device over a new sparse image of the lab; returns the device and the image.
    fn loop_dev(&self, name: &str, mib: u64) -> (PathBuf, PathBuf) {
        let img = self.dir("images").join(format!("{name}.img"));
        run(Command::new("truncate").arg("-s").arg(format!("{mib}M")).arg(&img));
        (self.loop_on(&img), img)
    }

    fn loop_on(&self, img: &Path) -> PathBuf {
        let out = run(Command::new("losetup").args(["--find", "--show"]).arg(img));
        let dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        self.push(Undo::Detach(dev.clone()));
        dev
    }

    fn mkfs(&self, fs_type: &str, dev: &Path) {
        match fs_type {
            "xfs" => run(Command::new("mkfs.xfs").args(["-q", "-f"]).arg(dev)),
            _ => run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(dev)),
        };
    }

    /// A filesystem of the formatted loop device at `dst`.
    fn disk(&self, name: &str, fs_type: &str, dst: &Path) -> PathBuf {
        let (dev, _) = self.loop_dev(name, if fs_type == "xfs" { 320 } else { 64 });
        self.mkfs(fs_type, &dev);
        self.mount_dev(&dev, dst);
        dev
    }

    /// A tmpfs outside every discovery directory, holding one file that must survive.
    fn canary(&self) -> PathBuf {
        let dir = self.tmpfs(&self.path("canary"), 8);
        let content = format!("canary of {}", self.root.display());
        std::fs::write(dir.join("CANARY"), &content).unwrap();
        *self.canary.borrow_mut() = Some((dir.clone(), content));
        dir
    }

    fn canary_problem(&self) -> Option<String> {
        let (dir, content) = self.canary.borrow().clone()?;
        let now = std::fs::read_to_string(dir.join("CANARY")).unwrap_or_default();
        (now != content).then(|| format!("the canary outside the discovery directories changed: {now:?}"))
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for u in std::mem::take(self.undo.get_mut()).iter().rev() {
            match u {
                Undo::Unmount(p) => {
                    if !quiet(Command::new("umount").arg(p)) {
                        quiet(Command::new("umount").arg("-l").arg(p));
                    }
                }
                Undo::Detach(d) => {
                    quiet(Command::new("losetup").arg("-d").arg(d));
                }
            }
        }
        remove_scratch_dir(&self.root, "attack");
    }
}

// ---------------------------------------------------------------------------------------------
// The cluster side: one fake node, its classes, claims and agents; everything removed at the end

struct Harness {
    // Field order is drop order: the PVs go first (Drop::drop), then the control plane, then
    // the mounts.
    cp: ControlPlane,
    lab: Lab,
    node: String,
    config: PathBuf,
    kubeconfig: PathBuf,
    claims: RefCell<Vec<String>>,
    logs: AtomicUsize,
    problems: RefCell<Vec<String>>,
}

impl Harness {
    fn new(name: &str) -> Option<Harness> {
        if !support::require_root(name) {
            return None;
        }
        let lab = Lab::new(name);
        let cp = ControlPlane::get();
        let node = format!("attack-{name}").replace('_', "-");
        cp.create_node(&node);
        let kubeconfig = cp.agent_kubeconfig(&lab.root);
        let config = lab.path("config");
        Some(Harness {
            cp,
            lab,
            node,
            config,
            kubeconfig,
            claims: RefCell::new(Vec::new()),
            logs: AtomicUsize::new(0),
            problems: RefCell::new(Vec::new()),
        })
    }

    /// Storage classes (reclaim Delete) and the config: (class, discovery directory, block).
    fn classes(&self, classes: &[(&str, &Path, bool)]) {
        let mut map = String::new();
        for (class, dir, block) in classes {
            self.cp.create_storage_class(class, "Delete");
            map.push_str(&format!("{class}:\n  hostDir: {d}\n  mountDir: {d}\n", d = dir.display()));
            if *block {
                map.push_str("  volumeMode: Block\n");
            }
        }
        write_config(&self.config, &[("storageClassMap", &map)]);
    }

    /// The path of the next agent log, created empty (so it can be watched before the start).
    fn next_log(&self) -> PathBuf {
        let log = self.lab.path(&format!("agent-{}.log", self.logs.fetch_add(1, Ordering::SeqCst)));
        std::fs::write(&log, b"").unwrap();
        log
    }

    fn agent_at(&self, log: &Path, extra: &[&str]) -> AgentProcess {
        let mut flags = Vec::new();
        if !extra.contains(&"--settle") {
            flags.extend_from_slice(&["--settle", "1s"]);
        }
        flags.extend_from_slice(extra);
        AgentProcess::start_with(&self.config, &self.node, &self.kubeconfig, log, &flags)
    }

    fn agent(&self, extra: &[&str]) -> AgentProcess {
        self.agent_at(&self.next_log(), extra)
    }

    fn claim(&self, claim: &str, class: &str, block: bool) -> String {
        self.claims.borrow_mut().push(claim.to_string());
        self.cp.bind_claim(claim, class, block)
    }

    fn release(&self, claim: &str) {
        self.cp.release_claim(claim);
    }

    fn prefix(&self) -> String {
        self.lab.root.display().to_string()
    }

    /// This test's PVs (by path), each as (name, path, phase, annotations).
    fn pvs(&self) -> Vec<(String, String, String, Value)> {
        self.cp
            .pvs_under(&self.prefix())
            .iter()
            .map(|pv| {
                (
                    pv["metadata"]["name"].as_str().unwrap_or_default().to_string(),
                    pv["spec"]["local"]["path"].as_str().unwrap_or_default().to_string(),
                    pv["status"]["phase"].as_str().unwrap_or_default().to_string(),
                    pv["metadata"]["annotations"].clone(),
                )
            })
            .collect()
    }

    fn pv_at(&self, path: &Path) -> Option<(String, String, Value)> {
        let path = path.display().to_string();
        self.pvs().into_iter().find(|(_, p, _, _)| *p == path).map(|(n, _, phase, ann)| (n, phase, ann))
    }

    fn wait_published(&self, path: &Path) -> String {
        wait_until(&format!("{} published", path.display()), WAIT, || {
            self.pv_at(path).filter(|(_, phase, _)| phase == "Available").map(|(n, _, _)| n)
        })
    }

    fn check(&self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            let msg = what();
            eprintln!("VIOLATION: {msg}");
            self.problems.borrow_mut().push(msg);
        }
    }

    /// Checks that nothing is ever published at `path` for `secs` seconds (polling).
    fn never_published(&self, path: &Path, secs: u64, why: &str) {
        let until = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < until {
            if let Some((name, phase, _)) = self.pv_at(path) {
                self.check(false, || format!("{} was published as PV {name} ({phase}): {why}", path.display()));
                return;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    fn has_node_event(&self, text: &str) -> bool {
        self.cp.has_event(&self.node, "VolumeNotPublished", text)
    }

    /// Fails the test with every violation found (and the canary's state).
    fn finish(&self) {
        if let Some(p) = self.lab.canary_problem()
            && !self.problems.borrow().iter().any(|q| q.starts_with(&p))
        {
            self.problems.borrow_mut().push(p);
        }
        let problems = self.problems.borrow().clone();
        assert!(problems.is_empty(), "{} violation(s):\n- {}", problems.len(), problems.join("\n- "));
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        for claim in self.claims.borrow().iter() {
            let _ = self.cp.kubectl(&["delete", "pod", claim, "-n", "default", "--grace-period=0", "--force"]);
            let _ = self.cp.kubectl(&["delete", "pvc", claim, "-n", "default", "--wait=false"]);
        }
        for pv in self.cp.pvs_under(&self.prefix()) {
            let name = pv["metadata"]["name"].as_str().unwrap_or_default().to_string();
            let remove = r#"[{"op":"remove","path":"/metadata/finalizers"}]"#;
            let _ = self.cp.kubectl(&["patch", "pv", &name, "--type=json", "-p", remove]);
            let _ = self.cp.kubectl(&["delete", "pv", &name, "--wait=false"]);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Racing the wipe: inotify on the agent's log and on the disk's device node

struct Inotify(OwnedFd);

impl Inotify {
    fn new() -> Inotify {
        // SAFETY: inotify_init1 takes flags only; a non-negative result is a new descriptor.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
        assert!(fd >= 0, "inotify_init1: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        Inotify(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn watch(&self, path: &Path, mask: u32) -> i32 {
        let c = CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid descriptor and a NUL-terminated path that lives for the call.
        let wd = unsafe { libc::inotify_add_watch(self.0.as_raw_fd(), c.as_ptr(), mask) };
        assert!(wd >= 0, "inotify_add_watch {}: {}", path.display(), std::io::Error::last_os_error());
        wd
    }

    /// The events queued (in order), waiting up to `timeout_ms` for the first.
    fn events(&self, timeout_ms: i32) -> Vec<(i32, u32)> {
        let mut pfd = libc::pollfd { fd: self.0.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd for the call.
        if unsafe { libc::poll(&mut pfd, 1, timeout_ms) } <= 0 {
            return Vec::new();
        }
        let mut buf = vec![0u8; 64 * 1024];
        // SAFETY: reads at most buf.len() bytes into buf.
        let n = unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        let mut out = Vec::new();
        let mut at = 0usize;
        while n > 0 && at + 16 <= n as usize {
            let word = |o: usize| u32::from_ne_bytes(buf[at + o..at + o + 4].try_into().unwrap());
            out.push((word(0) as i32, word(4)));
            at += 16 + word(12) as usize;
        }
        out
    }
}

/// Watches the agent's log and the device under a volume, so that a swap can be made in the
/// window between the wipe's identity check (which opens the device read-only and closes it)
/// and the wipe itself (which opens the volume by its path after posting an event).
struct Race {
    inotify: Inotify,
    log: PathBuf,
    wd_log: i32,
    wd_dev: i32,
    offset: u64,
}

impl Race {
    fn arm(log: &Path, device: &Path) -> Race {
        let inotify = Inotify::new();
        let wd_log = inotify.watch(log, libc::IN_MODIFY);
        let wd_dev = inotify.watch(device, libc::IN_CLOSE_NOWRITE);
        let offset = std::fs::metadata(log).map(|m| m.len()).unwrap_or(0);
        Race { inotify, log: log.to_path_buf(), wd_log, wd_dev, offset }
    }

    fn wipe_started(&mut self, pv: &str) -> bool {
        use std::io::{Read, Seek, SeekFrom};
        let Ok(mut f) = std::fs::File::open(&self.log) else { return false };
        let _ = f.seek(SeekFrom::Start(self.offset));
        let mut text = String::new();
        let _ = f.read_to_string(&mut text);
        // Only whole lines count.
        let Some(end) = text.rfind('\n') else { return false };
        self.offset += end as u64 + 1;
        text[..end].lines().any(|l| l.contains("starting wipe") && l.contains(pv))
    }

    /// Once the agent logs that it starts wiping `pv`, runs `swap` as soon as the device is
    /// closed by the identity check. False when that never happened within the wait.
    fn swap_after_check(&mut self, pv: &str, swap: &dyn Fn()) -> bool {
        let deadline = Instant::now() + WAIT;
        let mut armed = false;
        while Instant::now() < deadline {
            for (wd, mask) in self.inotify.events(100) {
                if wd == self.wd_log && !armed {
                    armed = self.wipe_started(pv);
                } else if wd == self.wd_dev && armed && mask & libc::IN_CLOSE_NOWRITE != 0 {
                    swap();
                    return true;
                }
            }
        }
        false
    }
}

/// How a raced wipe ended, read from the agent's log.
#[derive(Debug, PartialEq)]
enum WipeEnd {
    Wiped,
    /// The swap came before the identity check (the race was lost): try again.
    RefusedIdentity,
    Failed(String),
    Unknown,
}

fn wipe_end(log: &Path, pv: &str) -> Option<WipeEnd> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    for line in text.lines().filter(|l| l.contains(pv)) {
        if line.contains("volume wiped") {
            return Some(WipeEnd::Wiped);
        }
        if line.contains("wipe failed") {
            return Some(if line.contains("identity") {
                WipeEnd::RefusedIdentity
            } else {
                WipeEnd::Failed(line.to_string())
            });
        }
    }
    None
}

/// Releases `claim` (bound to `pv`) and makes `swap` happen between the wipe's identity check
/// and the wipe, restarting the agent (its wipe back-off is in memory) when the swap came too
/// early. Returns the agent running at the end and how the wipe ended.
fn race_the_wipe(
    h: &Harness,
    agent: AgentProcess,
    claim: &str,
    pv: &str,
    device: &Path,
    swap: &dyn Fn(),
    unswap: &dyn Fn(),
) -> (AgentProcess, WipeEnd) {
    let mut race = Race::arm(&agent.log, device);
    h.release(claim);
    let mut agent = agent;
    for attempt in 1..=4 {
        if !race.swap_after_check(pv, swap) {
            return (agent, WipeEnd::Unknown);
        }
        let log = agent.log.clone();
        let end = wait_until("the raced wipe to end", WAIT, || wipe_end(&log, pv));
        if end != WipeEnd::RefusedIdentity || attempt == 4 {
            return (agent, end);
        }
        eprintln!("attempt {attempt}: the swap came before the identity check; again with a new agent");
        unswap();
        drop(agent);
        let log = h.next_log();
        race = Race::arm(&log, device);
        agent = h.agent_at(&log, &[]);
    }
    unreachable!()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| format!("<{e}>"))
}

fn bind_now(src: &Path, dst: &Path) {
    use nix::mount::{MsFlags, mount};
    mount(Some(src), dst, None::<&str>, MsFlags::MS_BIND, None::<&str>).expect("bind mount");
}

// =============================================================================================
// Invariant 1: the wipe and its identity check

/// The identity check of a Filesystem wipe reads the disk at the volume's path, then the agent
/// posts an event, then the wipe opens the path again. A bind mount of another tenant's
/// (Bound) volume stacked on the released entry in between is wiped in its place.
#[test]
fn fs_wipe_race_a_bound_tenants_volume_bound_over_the_released_entry_after_the_check() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("fs-race") else { return };
    let disks = h.lab.dir("disks");
    h.lab.canary();
    let class = "attack-fs-race";
    let (a, b) = (disks.join("a"), disks.join("b"));
    let dev_a = h.lab.disk("a", "ext4", &a);
    h.lab.tmpfs(&b, 16);
    h.classes(&[(class, &disks, false)]);
    let agent = h.agent(&[]);
    let pv_a = h.wait_published(&a);
    let pv_b = h.wait_published(&b);
    // Bind both; the scheduler picks which claim gets which volume.
    let first = h.claim("fs-race-1", class, false);
    let second = h.claim("fs-race-2", class, false);
    let claim_a = if first == pv_a { "fs-race-1" } else { "fs-race-2" };
    assert!([&first, &second].contains(&&pv_b));
    std::fs::write(a.join("released-data"), b"old tenant of a").unwrap();
    std::fs::write(b.join("tenant-b"), b"live data of the tenant of b").unwrap();

    let stacked = std::cell::Cell::new(false);
    let swap = || {
        bind_now(&b, &a);
        stacked.set(true);
    };
    let unswap = || {
        if stacked.replace(false) {
            umount_when_idle(&a);
        }
    };
    let (agent, end) = race_the_wipe(&h, agent, claim_a, &pv_a, &dev_a, &swap, &unswap);
    eprintln!("raced wipe of {pv_a}: {end:?}");
    let b_data = read(&b.join("tenant-b"));
    h.check(b_data == "live data of the tenant of b", || {
        format!(
            "the wipe of Released PV {pv_a} (entry {}) destroyed the data of Bound PV {pv_b}: a bind of {} was \
             stacked on {} after the identity check and before the wipe opened the path (outcome {end:?}, file now \
             {b_data:?})",
            a.display(),
            b.display(),
            a.display()
        )
    });
    unswap();
    if h.pv_at(&b).is_none_or(|(_, phase, _)| phase != "Bound") {
        h.check(false, || format!("PV {pv_b} of the bound tenant is no longer Bound"));
    }
    drop(agent);
    h.finish();
}

/// The same race with a filesystem outside every discovery directory (the canary) bound over
/// the released entry: the wipe empties it (invariant 3). With `mount --bind / entry` the walk
/// would empty the host's root filesystem (a non-recursive bind has no nested mounts to stop it).
#[test]
fn fs_wipe_race_a_filesystem_outside_bound_over_the_released_entry_after_the_check() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("fs-race-out") else { return };
    let disks = h.lab.dir("disks");
    let canary = h.lab.canary();
    let class = "attack-fs-race-out";
    let a = disks.join("a");
    let dev_a = h.lab.disk("a", "ext4", &a);
    h.classes(&[(class, &disks, false)]);
    let agent = h.agent(&[]);
    let pv_a = h.wait_published(&a);
    assert_eq!(h.claim("fs-race-out-1", class, false), pv_a);
    std::fs::write(a.join("released-data"), b"old tenant of a").unwrap();
    let stacked = std::cell::Cell::new(false);
    let swap = || {
        bind_now(&canary, &a);
        stacked.set(true);
    };
    let unswap = || {
        if stacked.replace(false) {
            umount_when_idle(&a);
        }
    };
    let (agent, end) = race_the_wipe(&h, agent, "fs-race-out-1", &pv_a, &dev_a, &swap, &unswap);
    eprintln!("raced wipe of {pv_a}: {end:?}");
    if let Some(p) = h.lab.canary_problem() {
        h.check(false, || {
            format!(
                "{p}: the wipe of Released PV {pv_a} emptied {} (outside the discovery directory), bound over {} \
                 after the identity check (outcome {end:?})",
                canary.display(),
                a.display()
            )
        });
    }
    unswap();
    drop(agent);
    h.finish();
}

/// The same race for a Block PV: the entry is a symlink to the device; after the identity
/// check the attacker points it at another tenant's (Bound) device, which the wipe opens.
#[test]
fn block_wipe_race_symlink_turned_to_a_bound_tenants_device_after_the_check() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("blk-race") else { return };
    let blk = h.lab.dir("blk");
    h.lab.canary();
    let class = "attack-blk-race";
    let (dev_a, _) = h.lab.loop_dev("a", 32);
    let (dev_b, _) = h.lab.loop_dev("b", 32);
    let (a, b) = (blk.join("a"), blk.join("b"));
    symlink(&dev_a, &a).unwrap();
    symlink(&dev_b, &b).unwrap();
    h.classes(&[(class, &blk, true)]);
    let agent = h.agent(&[]);
    let pv_a = h.wait_published(&a);
    let pv_b = h.wait_published(&b);
    let first = h.claim("blk-race-1", class, true);
    h.claim("blk-race-2", class, true);
    let claim_a = if first == pv_a { "blk-race-1" } else { "blk-race-2" };
    // The tenant of b keeps a filesystem on its device.
    let uuid_b = "6a3f0c1e-1b2c-4d5e-8f90-a1b2c3d4e5f6";
    run(Command::new("mkfs.ext4").args(["-q", "-F", "-U", uuid_b]).arg(&dev_b));
    let blkid_b = || {
        let out = Command::new("blkid").args(["-p", "-o", "value", "-s", "UUID"]).arg(&dev_b).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(blkid_b(), uuid_b);

    let tmp_link = blk.join(".swap");
    let point = |to: &Path| {
        let _ = std::fs::remove_file(&tmp_link);
        symlink(to, &tmp_link).unwrap();
        std::fs::rename(&tmp_link, &a).unwrap();
    };
    let swap = || point(&dev_b);
    let unswap = || point(&dev_a);
    let (agent, end) = race_the_wipe(&h, agent, claim_a, &pv_a, &dev_a, &swap, &unswap);
    eprintln!("raced wipe of {pv_a}: {end:?}");
    let now = blkid_b();
    h.check(now == uuid_b, || {
        format!(
            "the wipe of Released Block PV {pv_a} erased the filesystem of Bound Block PV {pv_b} ({}): the entry {} \
             was re-pointed from {} to {} after the identity check (outcome {end:?}, blkid UUID now {now:?})",
            dev_b.display(),
            a.display(),
            dev_a.display(),
            dev_b.display()
        )
    });
    unswap();
    drop(agent);
    h.finish();
}

/// While Bound, each volume is replaced: an ext4 volume by a bind of its own subdirectory, a
/// tmpfs by a new tmpfs at the same path, and a Block PV's loop device is detached and another
/// image (another tenant's disk) attached at the same /dev/loopN. None of them is wiped when
/// released, nor published again.
#[test]
fn volumes_replaced_while_bound_are_never_wiped() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("swaps") else { return };
    let disks = h.lab.dir("disks");
    let blk = h.lab.dir("blk");
    h.lab.canary();
    let (fs_class, blk_class) = ("attack-swaps-fs", "attack-swaps-blk");
    let (e, t, k) = (disks.join("e"), disks.join("t"), blk.join("k"));
    h.lab.disk("e", "ext4", &e);
    h.lab.tmpfs(&t, 16);
    let (dev_k, _) = h.lab.loop_dev("k", 32);
    symlink(&dev_k, &k).unwrap();
    h.classes(&[(fs_class, &disks, false), (blk_class, &blk, true)]);
    let agent = h.agent(&[]);
    for p in [&e, &t, &k] {
        h.wait_published(p);
    }
    h.claim("swaps-1", fs_class, false);
    h.claim("swaps-2", fs_class, false);
    h.claim("swaps-3", blk_class, true);
    let pv = |p: &Path| h.pv_at(p).unwrap().0;
    let (pv_e, pv_t, pv_k) = (pv(&e), pv(&t), pv(&k));
    drop(agent);

    // ext4: the volume is covered by a bind of its own subdirectory.
    std::fs::create_dir_all(e.join("sub")).unwrap();
    std::fs::write(e.join("sub/data"), b"sub of e").unwrap();
    std::fs::write(e.join("top"), b"top of e").unwrap();
    h.lab.bind(&e.join("sub"), &e);
    // tmpfs: remounted (a new tmpfs at the same path, the attacker's file in it).
    h.lab.tmpfs(&t, 16);
    std::fs::write(t.join("other"), b"not the tenant's volume").unwrap();
    // Block: the loop device detached, another tenant's image attached at the same node.
    run(Command::new("losetup").arg("-d").arg(&dev_k));
    let other = h.lab.dir("images").join("other.img");
    run(Command::new("truncate").args(["-s", "32M"]).arg(&other));
    let uuid = "0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f";
    run(Command::new("mkfs.ext4").args(["-q", "-F", "-U", uuid]).arg(&other));
    run(Command::new("losetup").arg(&dev_k).arg(&other));
    for claim in ["swaps-1", "swaps-2", "swaps-3"] {
        h.release(claim);
    }
    for name in [&pv_e, &pv_t, &pv_k] {
        wait_until("Released", WAIT, || (h.cp.pv_state(name)?.1 == "Released").then_some(()));
    }
    // A long settle keeps presence from flagging the volumes first: each wipe meets the check.
    let agent = h.agent(&["--settle", "1h"]);
    for name in [&pv_e, &pv_t, &pv_k] {
        wait_until(&format!("the wipe of {name} refused"), WAIT, || {
            h.cp.has_event(name, "VolumeFailedDelete", "identity").then_some(())
        });
    }
    std::thread::sleep(Duration::from_secs(3));
    h.check(read(&e.join("data")) == "sub of e", || format!("the bind of e/sub was wiped: {}", read(&e.join("data"))));
    h.check(read(&t.join("other")) == "not the tenant's volume", || "the new tmpfs at t was wiped".into());
    let out = Command::new("blkid").args(["-p", "-o", "value", "-s", "UUID"]).arg(&dev_k).output().unwrap();
    let now = String::from_utf8_lossy(&out.stdout).trim().to_string();
    h.check(now == uuid, || {
        format!("the image attached at {} in place of the PV's was wiped ({now:?})", dev_k.display())
    });
    for name in [&pv_e, &pv_t, &pv_k] {
        let phase = h.cp.pv_state(name).map(|(_, p)| p);
        h.check(phase.as_deref() == Some("Released"), || format!("{name} is {phase:?}, not kept Released"));
    }
    drop(agent);
    h.lab.umount(&e);
    h.check(read(&e.join("top")) == "top of e", || "the covered ext4 volume was wiped".into());
    h.finish();
}

/// During a wipe, the attacker replaces not-yet-wiped subdirectories by symlinks to the canary
/// outside and mounts the canary on others: the wipe removes the links without following them
/// and stops at the first mount, and nothing of the canary is lost.
#[test]
fn nested_mounts_and_symlinks_appearing_during_a_wipe_are_never_crossed() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("during") else { return };
    let disks = h.lab.dir("disks");
    let canary = h.lab.canary();
    let class = "attack-during";
    let v = disks.join("v");
    h.lab.tmpfs(&v, 2048);
    h.classes(&[(class, &disks, false)]);
    let agent = h.agent(&[]);
    let pv = h.wait_published(&v);
    h.claim("during-1", class, false);
    let dirs = 300;
    for d in 0..dirs {
        let dir = v.join(format!("d{d:03}"));
        std::fs::create_dir_all(dir.join("inner")).unwrap();
        for f in 0..400 {
            std::fs::write(dir.join(format!("f{f}")), b"").unwrap();
        }
    }
    let inotify = Inotify::new();
    inotify.watch(&v, libc::IN_DELETE);
    h.release("during-1");
    // The first deletion: the wipe is walking the volume. Attack every directory still there.
    wait_until("the wipe to start deleting", WAIT, || (!inotify.events(100).is_empty()).then_some(()));
    let (mut links, mut mounts) = (0, 0);
    for d in (0..dirs).rev() {
        let dir = v.join(format!("d{d:03}"));
        if d % 2 == 0 {
            // A symlink to the canary in place of a subdirectory.
            let inner = dir.join("inner");
            if std::fs::rename(&inner, dir.join("inner.old")).is_ok() && symlink(&canary, &inner).is_ok() {
                links += 1;
            }
        } else if dir.join("inner").is_dir() {
            let target = dir.join("inner");
            let bound =
                nix::mount::mount(Some(&canary), &target, None::<&str>, nix::mount::MsFlags::MS_BIND, None::<&str>);
            if bound.is_ok() {
                h.lab.push(Undo::Unmount(target));
                mounts += 1;
            }
        }
    }
    eprintln!("during the wipe: {links} symlinks and {mounts} nested mounts of the canary");
    assert!(mounts > 0, "the wipe finished before any nested mount appeared; the test needs a bigger tree");
    // The walk may first trip over a directory just turned into a symlink (ENOTDIR: a failed
    // wipe, retried); the event series keeps its first note, the PV's result annotation the last.
    let text = "mount point inside the volume";
    wait_until("the wipe stopped at a nested mount", WAIT, || {
        let result =
            h.cp.get_json(&["pv", &pv])?["metadata"]["annotations"]["local-static-provisioner.io/cleanup-result"]
                .as_str()
                .map(str::to_string);
        (h.cp.has_event(&pv, "VolumeFailedDelete", text) || result.is_some_and(|r| r.contains(text))).then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    let phase = h.cp.pv_state(&pv).map(|(_, p)| p);
    h.check(phase.as_deref() == Some("Released"), || format!("{pv} is {phase:?}: a volume with a mount inside"));
    h.check(read(&canary.join("CANARY")).starts_with("canary of"), || "the canary was wiped through the volume".into());
    drop(agent);
    h.finish();
}

// =============================================================================================
// Invariant 2: a tenant's disk is never offered again unwiped

/// Known rule (disk-published): a Bound volume moved (`mount --move`) to another entry, of its
/// class or of another class, is not published there. tmpfs, ext4 and XFS.
#[test]
fn a_bound_volume_moved_to_another_entry_is_not_published() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("moved") else { return };
    let disks = h.lab.dir("disks");
    let other = h.lab.dir("other");
    h.lab.canary();
    let (class, class2) = ("attack-moved", "attack-moved-2");
    let (t, e, x) = (disks.join("t"), disks.join("e"), disks.join("x"));
    h.lab.tmpfs(&t, 16);
    h.lab.disk("e", "ext4", &e);
    h.lab.disk("x", "xfs", &x);
    h.classes(&[(class, &disks, false), (class2, &other, false)]);
    let agent = h.agent(&[]);
    for p in [&t, &e, &x] {
        h.wait_published(p);
    }
    for i in 1..=3 {
        h.claim(&format!("moved-{i}"), class, false);
    }
    for p in [&t, &e, &x] {
        std::fs::write(p.join("tenant"), b"tenant data").unwrap();
    }
    let (t2, e2, x2) = (disks.join("t2"), other.join("e2"), disks.join("x2"));
    h.lab.move_mount(&t, &t2);
    h.lab.move_mount(&e, &e2);
    h.lab.move_mount(&x, &x2);
    for (moved, from) in [(&t2, &t), (&e2, &e), (&x2, &x)] {
        let pv = h.pv_at(from).unwrap().0;
        wait_until(&format!("{} refused", moved.display()), WAIT, || {
            h.has_node_event(&format!("its disk is already published as PV {pv} at {}", from.display())).then_some(())
        });
    }
    for moved in [&t2, &e2, &x2] {
        h.never_published(moved, 2, "a Bound tenant's disk moved to another entry");
    }
    drop(agent);
    h.finish();
}

/// The disk-published rule compares the whole recorded identity, root inode included. A
/// Bound volume reached through a bind of one of its subdirectories (then the original entry
/// unmounted; the bind keeps the filesystem and the tenant's data alive) is another "identity"
/// and is published as Available with the tenant's data. tmpfs and ext4.
#[test]
fn a_bound_volume_reached_through_a_bind_of_its_subdirectory_is_not_published() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("subdir") else { return };
    let disks = h.lab.dir("disks");
    h.lab.canary();
    let class = "attack-subdir";
    let (t, e) = (disks.join("t"), disks.join("e"));
    h.lab.tmpfs(&t, 16);
    h.lab.disk("e", "ext4", &e);
    h.classes(&[(class, &disks, false)]);
    let agent = h.agent(&[]);
    h.wait_published(&t);
    h.wait_published(&e);
    h.claim("subdir-1", class, false);
    h.claim("subdir-2", class, false);
    for p in [&t, &e] {
        std::fs::create_dir_all(p.join("app")).unwrap();
        std::fs::write(p.join("app/secret"), b"tenant data").unwrap();
    }
    let (t2, e2) = (disks.join("t2"), disks.join("e2"));
    h.lab.bind(&t.join("app"), &t2);
    h.lab.bind(&e.join("app"), &e2);
    // While the original entries are there, the binds are refused (they share its disk).
    for (bind, orig) in [(&t2, &t), (&e2, &e)] {
        let pv = h.pv_at(orig).unwrap().0;
        wait_until(&format!("{} refused", bind.display()), WAIT, || {
            h.has_node_event(&format!("its disk is already published as PV {pv}")).then_some(())
        });
    }
    // The original entries go away; the binds keep each filesystem (and the data) alive.
    h.lab.umount(&t);
    h.lab.umount(&e);
    for bind in [&t2, &e2] {
        h.never_published(bind, 8, "a bind of a subdirectory of a Bound tenant's volume, with its data");
    }
    for bind in [&t2, &e2] {
        if let Some((name, phase, _)) = h.pv_at(bind) {
            eprintln!("{} published as {name} ({phase}), holding {:?}", bind.display(), read(&bind.join("secret")));
        }
    }
    drop(agent);
    h.finish();
}

/// The disk-published rule compares the recorded identity as a string, device number
/// included, though the device number "proves nothing". A Bound ext4 volume unmounted and
/// mounted again at another entry from a second loop device over the same image (as after a
/// reboot that enumerated the disk under another number) is published with the tenant's data.
#[test]
fn a_bound_ext4_volume_mounted_again_from_another_device_number_is_not_published() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("renumbered") else { return };
    let disks = h.lab.dir("disks");
    h.lab.canary();
    let class = "attack-renumbered";
    let r = disks.join("r");
    let (dev, img) = h.lab.loop_dev("r", 64);
    h.lab.mkfs("ext4", &dev);
    h.lab.mount_dev(&dev, &r);
    h.classes(&[(class, &disks, false)]);
    let agent = h.agent(&[]);
    let pv = h.wait_published(&r);
    assert_eq!(h.claim("renumbered-1", class, false), pv);
    std::fs::write(r.join("secret"), b"tenant data").unwrap();
    h.lab.umount(&r);
    let dev2 = h.lab.loop_on(&img);
    assert_ne!(dev, dev2);
    let r2 = disks.join("r2");
    h.lab.mount_dev(&dev2, &r2);
    wait_until("the volume of the Bound PV flagged missing", WAIT, || {
        h.pv_at(&r).and_then(|(_, _, ann)| ann[ANN_MISSING].as_str().map(|_| ()))
    });
    h.never_published(&r2, 8, "the Bound tenant's ext4 disk, mounted from another loop device number");
    if let Some((name, phase, _)) = h.pv_at(&r2) {
        eprintln!("{} published as {name} ({phase}), holding {:?}", r2.display(), read(&r2.join("secret")));
    }
    drop(agent);
    h.finish();
}

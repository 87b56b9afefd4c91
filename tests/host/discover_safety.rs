//! Data-safety invariants of discovery (issue 12), proven with `discover` against real mounts,
//! bind mounts, loop devices and partitions on this machine, and then attacked with set-ups
//! nobody named. Every test keeps a canary filesystem outside the discovery directories that
//! must never be published and must be intact at the end.
//!
//! Besides what each test expects of the agent (reason codes on stderr), every published PV is
//! checked by an independent oracle that asks the kernel, not the agent's code, what the PV's
//! path really shows (statx mount ID, mount table line by ID, sysfs, loop backing files):
//! a directory PV must be the root of the mount visible at its path, of no kernel filesystem,
//! containing neither the host root, a system directory, a discovery directory nor a canary,
//! and not inside a sensitive host directory; a block PV must not be mounted, held or open
//! exclusively, directly or through what it is made of; no two PVs may share data.
//!
//! Needs root; skipped with a message otherwise. Every mount, loop device, namespace and
//! directory made outside the test's own directory is undone when the test ends, panicking or
//! not (in reverse order, `umount -l` as a last resort), and the test's directory is only
//! deleted once nothing is mounted below it.

use crate::support;

use std::cell::{Cell, RefCell};
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::libc;
use serde_json::Value;
use support::{binary, quiet, remove_scratch_dir, run, unescape_mount_path};

/// Directories no volume may contain (as the issue lists them; the oracle's own copy).
const SYSTEM_DIRS: [&str; 20] = [
    "/",
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/home",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/sys",
    "/tmp",
    "/usr",
    "/var",
    "/var/lib",
    "/var/lib/kubelet",
];

/// Host directories no volume may even lie inside.
const SENSITIVE_DIRS: [&str; 14] = [
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib64",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/sys",
    "/usr",
    "/var/lib/kubelet",
    "/var/log",
];

/// Areas where every mount is the host's own.
const HOST_MOUNT_AREAS: [&str; 6] = ["/boot", "/dev", "/etc", "/proc", "/run", "/sys"];

/// Kernel and container filesystems: never a disk.
const PSEUDO_FS: [&str; 18] = [
    "proc",
    "sysfs",
    "devtmpfs",
    "devpts",
    "overlay",
    "cgroup",
    "cgroup2",
    "mqueue",
    "ramfs",
    "tracefs",
    "debugfs",
    "securityfs",
    "configfs",
    "bpf",
    "hugetlbfs",
    "nsfs",
    "pstore",
    "autofs",
];

// ---------------------------------------------------------------------------------------------
// Commands

fn tool_exists(name: &str) -> bool {
    ["/usr/sbin", "/usr/bin", "/sbin", "/bin"].iter().any(|d| Path::new(d).join(name).exists())
}

// ---------------------------------------------------------------------------------------------
// The kernel's view, read independently of the agent's code

/// One line of /proc/self/mountinfo.
#[derive(Debug, Clone)]
struct MountLine {
    id: u64,
    dev: String,
    root: PathBuf,
    point: PathBuf,
    fs_type: String,
}

fn mountinfo() -> Vec<MountLine> {
    let text = std::fs::read("/proc/self/mountinfo").expect("reading mountinfo");
    String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            let sep = f.iter().position(|x| *x == "-")?;
            Some(MountLine {
                id: f.first()?.parse().ok()?,
                dev: f.get(2)?.to_string(),
                root: unescape_mount_path(f.get(3)?),
                point: unescape_mount_path(f.get(4)?),
                fs_type: f.get(sep + 1)?.to_string(),
            })
        })
        .collect()
}

/// What statx says about a path (symlinks not followed): the mount visible there and whether
/// the path is that mount's root.
struct Statx {
    mnt_id: u64,
    mount_root: Option<bool>,
}

fn statx(path: &Path, follow: bool) -> Option<Statx> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut buf = MaybeUninit::<libc::statx>::zeroed();
    let flags = if follow { 0 } else { libc::AT_SYMLINK_NOFOLLOW };
    let mask = libc::STATX_BASIC_STATS | libc::STATX_MNT_ID;
    // SAFETY: statx reads the NUL-terminated path and writes one `struct statx` into `buf`,
    // which is that size and outlives the call.
    let rc = unsafe { libc::syscall(libc::SYS_statx, libc::AT_FDCWD, c.as_ptr(), flags, mask, buf.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: zero-initialised, then filled by the kernel.
    let st = unsafe { buf.assume_init() };
    let bit = libc::STATX_ATTR_MOUNT_ROOT as u64;
    Some(Statx {
        mnt_id: st.stx_mnt_id,
        mount_root: (st.stx_attributes_mask & bit != 0).then_some(st.stx_attributes & bit != 0),
    })
}

/// Where a path really lives: the mount visible at it (by statx mount ID) and the path inside
/// that filesystem.
fn location(path: &Path, follow: bool, table: &[MountLine]) -> Option<(MountLine, PathBuf)> {
    let sx = statx(path, follow)?;
    let line = table.iter().find(|m| m.id == sx.mnt_id)?.clone();
    let canon = if follow { std::fs::canonicalize(path).ok()? } else { path.to_path_buf() };
    let inside = match canon.strip_prefix(&line.point) {
        Ok(rest) if rest.as_os_str().is_empty() => line.root.clone(),
        Ok(rest) => line.root.join(rest),
        Err(_) => line.root.clone(),
    };
    Some((line, inside))
}

fn dev_text(dev: u64) -> String {
    format!("{}:{}", nix::sys::stat::major(dev), nix::sys::stat::minor(dev))
}

fn sys_block(dev: &str) -> PathBuf {
    PathBuf::from(format!("/sys/dev/block/{dev}"))
}

fn read_trim(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// A piece of storage a volume occupies: a directory of a filesystem, or a sector range of a
/// whole disk. Two volumes share data when any of their atoms overlap.
#[derive(Debug, Clone)]
enum Atom {
    Area { dev: String, path: PathBuf },
    Range { whole: String, start: u64, end: u64 },
}

fn overlap(a: &Atom, b: &Atom) -> bool {
    match (a, b) {
        (Atom::Area { dev: d1, path: p1 }, Atom::Area { dev: d2, path: p2 }) => {
            d1 == d2 && (p1.starts_with(p2) || p2.starts_with(p1))
        }
        (Atom::Range { whole: w1, start: s1, end: e1 }, Atom::Range { whole: w2, start: s2, end: e2 }) => {
            w1 == w2 && s1 < e2 && s2 < e1
        }
        _ => false,
    }
}

/// The storage under the block device `dev` (`major:minor`): its sector range on the whole
/// disk, and, for a loop device, what its backing file or device occupies.
fn block_atoms(dev: &str, table: &[MountLine], depth: usize) -> Vec<Atom> {
    let sys = sys_block(dev);
    if depth > 8 || !sys.exists() {
        return Vec::new();
    }
    let size: u64 = read_trim(&sys.join("size")).and_then(|s| s.parse().ok()).unwrap_or(0);
    let (whole, start) = if sys.join("partition").exists() {
        let parent = std::fs::canonicalize(&sys).ok().and_then(|p| p.parent().map(Path::to_path_buf));
        let whole = parent.and_then(|p| read_trim(&p.join("dev"))).unwrap_or_else(|| dev.to_string());
        (whole, read_trim(&sys.join("start")).and_then(|s| s.parse().ok()).unwrap_or(0))
    } else {
        (dev.to_string(), 0)
    };
    let mut atoms = vec![Atom::Range { whole: whole.clone(), start, end: start + size.max(1) }];
    // What a loop device is made of (for a partition, its range of the disk above is enough).
    if let Some(backing) = read_trim(&sys.join("loop/backing_file")) {
        let backing = PathBuf::from(backing.trim_end_matches(" (deleted)"));
        if let Ok(meta) = std::fs::metadata(&backing) {
            if meta.file_type().is_block_device() {
                atoms.extend(block_atoms(&dev_text(meta.rdev()), table, depth + 1));
            } else if let Some((line, inside)) = location(&backing, true, table) {
                // The file's place in its filesystem (not that whole filesystem's disk: files
                // of one disk are different data).
                atoms.push(Atom::Area { dev: line.dev, path: inside });
            }
        }
    }
    atoms
}

/// Why the block device `dev` is in use, by the kernel's account.
fn block_in_use(path: &Path, dev: &str, table: &[MountLine]) -> Option<String> {
    let mine = block_atoms(dev, table, 0);
    let mut devs = vec![dev.to_string()];
    if let Ok(rd) = std::fs::read_dir(sys_block(dev)) {
        for e in rd.flatten() {
            if e.path().join("partition").exists()
                && let Some(d) = read_trim(&e.path().join("dev"))
            {
                devs.push(d);
            }
        }
    }
    for d in &devs {
        if std::fs::read_dir(sys_block(d).join("holders")).is_ok_and(|mut rd| rd.next().is_some()) {
            return Some(format!("{d} has holders"));
        }
    }
    // Mounted, directly or through what it is made of (a partition, a loop on the same file).
    for m in table.iter().filter(|m| sys_block(&m.dev).exists()) {
        let theirs = block_atoms(&m.dev, table, 0);
        let theirs_ranges: Vec<&Atom> = theirs.iter().collect();
        if mine.iter().any(|a| theirs_ranges.iter().any(|b| overlap(a, b))) {
            return Some(format!("its data is mounted at {} (device {})", m.point.display(), m.dev));
        }
    }
    match OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_EXCL | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).bits())
        .open(path)
    {
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Some("it is open exclusively".to_string()),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// Classes, discover and its answers

#[derive(Debug, Clone)]
struct Class {
    name: String,
    host_dir: PathBuf,
    mount_dir: PathBuf,
    block: bool,
    pattern: Option<String>,
}

fn fs_class(name: &str, dir: &Path) -> Class {
    Class { name: name.into(), host_dir: dir.into(), mount_dir: dir.into(), block: false, pattern: None }
}

fn block_class(name: &str, dir: &Path) -> Class {
    Class { block: true, ..fs_class(name, dir) }
}

impl Class {
    fn host(mut self, dir: &str) -> Class {
        self.host_dir = dir.into();
        self
    }

    fn pattern(mut self, p: &str) -> Class {
        self.pattern = Some(p.into());
        self
    }

    fn yaml(&self) -> String {
        let q = |p: &Path| serde_json::to_string(&p.to_string_lossy()).unwrap();
        let mut s = format!("{}:\n  hostDir: {}\n  mountDir: {}\n", self.name, q(&self.host_dir), q(&self.mount_dir));
        if self.block {
            s.push_str("  volumeMode: Block\n");
        }
        if let Some(p) = &self.pattern {
            s.push_str(&format!("  namePattern: {}\n", serde_json::to_string(p).unwrap()));
        }
        s
    }
}

/// What one `discover` run printed.
struct Found {
    items: Vec<Value>,
    stderr: String,
    classes: Vec<Class>,
}

impl Found {
    fn host_paths(&self) -> Vec<String> {
        self.items.iter().filter_map(|pv| pv["spec"]["local"]["path"].as_str().map(str::to_string)).collect()
    }

    fn is_published(&self, path: &Path) -> bool {
        let text = path.to_string_lossy();
        self.items.iter().any(|pv| pv["spec"]["local"]["path"].as_str() == Some(&*text))
    }

    /// The reason code discover gave for not publishing `path` (scan skip or planner refusal).
    fn reason(&self, path: &Path) -> Option<String> {
        let needle = format!("skipped {} (", path.to_string_lossy());
        let at = self.stderr.find(&needle)? + needle.len();
        let rest = &self.stderr[at..];
        let code = rest[rest.find("reason ")? + "reason ".len()..].split(')').next()?;
        Some(code.to_string())
    }

    /// The path of a PV as the agent sees it (hostDir mapped to mountDir).
    fn agent_path(&self, pv: &Value) -> Option<PathBuf> {
        let host = PathBuf::from(pv["spec"]["local"]["path"].as_str()?);
        let class = self.classes.iter().find(|c| pv["spec"]["storageClassName"] == c.name.as_str())?;
        Some(class.mount_dir.join(host.strip_prefix(&class.host_dir).ok()?))
    }
}

// ---------------------------------------------------------------------------------------------
// The lab: one test's directory, everything it set up, and what it found wrong

#[derive(Debug)]
enum Undo {
    /// Unmount one mount (lazily if it is busy).
    Unmount(PathBuf),
    /// Unmount a recursive bind.
    UnmountTree(PathBuf),
    /// Detach a loop device.
    Detach(PathBuf),
    /// Remove a directory the test created outside its own directory (only if empty).
    RemoveDir(PathBuf),
    /// Remove a device-mapper device.
    DmRemove(String),
    /// Unmount `target` inside the mount namespace pinned at `ns`, then release the namespace.
    NsUnmount { ns: PathBuf, target: PathBuf },
}

impl Undo {
    fn run(&self) {
        match self {
            Undo::Unmount(p) => {
                if !quiet(Command::new("umount").arg(p)) {
                    quiet(Command::new("umount").arg("-l").arg(p));
                }
            }
            Undo::UnmountTree(p) => {
                if !quiet(Command::new("umount").arg("-R").arg(p)) {
                    quiet(Command::new("umount").arg("-l").arg(p));
                }
            }
            Undo::Detach(dev) => {
                quiet(Command::new("losetup").arg("-d").arg(dev));
            }
            Undo::RemoveDir(p) => {
                let _ = std::fs::remove_dir(p);
            }
            Undo::DmRemove(name) => {
                quiet(Command::new("dmsetup").args(["remove", "--retry", name]));
            }
            Undo::NsUnmount { ns, target } => {
                quiet(Command::new("nsenter").arg(format!("--mount={}", ns.display())).arg("umount").arg(target));
                // The namespace is released a moment after its last mount goes.
                let start = Instant::now();
                while !quiet(Command::new("umount").arg(ns)) {
                    if start.elapsed() > Duration::from_secs(5) {
                        quiet(Command::new("umount").arg("-l").arg(ns));
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }
}

/// A filesystem outside every discovery directory, holding a file; it must never be published.
#[derive(Debug, Clone)]
struct Canary {
    mount: PathBuf,
    file: PathBuf,
    content: String,
    /// `major:minor` of the filesystem.
    dev: String,
}

struct Lab {
    name: &'static str,
    root: PathBuf,
    undo: RefCell<Vec<Undo>>,
    canaries: RefCell<Vec<Canary>>,
    problems: RefCell<Vec<String>>,
    counter: Cell<usize>,
}

impl Lab {
    fn new(name: &'static str) -> Option<Lab> {
        if !support::require_root(name) {
            return None;
        }
        static N: AtomicUsize = AtomicUsize::new(0);
        let root = PathBuf::from(format!(
            "/tmp/lsp-safety-{}-{}-{name}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&root).unwrap();
        let lab = Lab {
            name,
            root,
            undo: RefCell::new(Vec::new()),
            canaries: RefCell::new(Vec::new()),
            problems: RefCell::new(Vec::new()),
            counter: Cell::new(0),
        };
        // The lab is a private mount of its own: nothing mounted in it propagates anywhere,
        // and `mount --move` works on hosts whose root is a shared mount.
        lab.bind(&lab.root, &lab.root);
        Some(lab)
    }

    fn next(&self) -> usize {
        self.counter.set(self.counter.get() + 1);
        self.counter.get()
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

    /// Records a failed expectation; the test fails at `finish` with all of them.
    fn check(&self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            let msg = what();
            eprintln!("[{}] VIOLATION: {msg}", self.name);
            self.problems.borrow_mut().push(msg);
        }
    }

    // --- mounts -----------------------------------------------------------------------------

    fn tmpfs(&self, dst: &Path, mib: u64) -> PathBuf {
        std::fs::create_dir_all(dst).unwrap();
        run(Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"]).arg(dst));
        self.push(Undo::Unmount(dst.into()));
        dst.into()
    }

    /// `mount --bind src dst`, made private at once so that unmounting it can never propagate
    /// to the host's own mounts on a host with shared propagation.
    fn bind(&self, src: &Path, dst: &Path) -> PathBuf {
        if !dst.exists() {
            std::fs::create_dir_all(dst).unwrap();
        }
        run(Command::new("mount").arg("--bind").arg(src).arg(dst));
        self.push(Undo::Unmount(dst.into()));
        run(Command::new("mount").arg("--make-private").arg(dst));
        dst.into()
    }

    /// `mount --rbind src dst`, made recursively private at once.
    fn rbind(&self, src: &Path, dst: &Path) -> PathBuf {
        std::fs::create_dir_all(dst).unwrap();
        run(Command::new("mount").arg("--rbind").arg(src).arg(dst));
        self.push(Undo::UnmountTree(dst.into()));
        run(Command::new("mount").arg("--make-rprivate").arg(dst));
        dst.into()
    }

    /// Bind-mounts a file or device node onto a new empty file `dst`.
    fn bind_file(&self, src: &Path, dst: &Path) -> PathBuf {
        File::create(dst).unwrap();
        run(Command::new("mount").arg("--bind").arg(src).arg(dst));
        self.push(Undo::Unmount(dst.into()));
        run(Command::new("mount").arg("--make-private").arg(dst));
        dst.into()
    }

    /// `mount -t fs_type [-o opts] source dst`; Err when the kernel or sandbox refuses it.
    fn try_mount(&self, fs_type: &str, source: &str, opts: Option<&str>, dst: &Path) -> Result<PathBuf, String> {
        std::fs::create_dir_all(dst).unwrap();
        let mut cmd = Command::new("mount");
        cmd.args(["-t", fs_type]);
        if let Some(o) = opts {
            cmd.args(["-o", o]);
        }
        let out = cmd.arg(source).arg(dst).output().unwrap();
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        self.push(Undo::Unmount(dst.into()));
        Ok(dst.into())
    }

    fn mount_dev(&self, dev: &Path, dst: &Path) -> PathBuf {
        std::fs::create_dir_all(dst).unwrap();
        run(Command::new("mount").arg(dev).arg(dst));
        self.push(Undo::Unmount(dst.into()));
        dst.into()
    }

    /// `mount --move from to`; the cleanup entry follows the mount.
    fn move_mount(&self, from: &Path, to: &Path) {
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

    /// Creates `dir` (and missing parents) outside the lab, removed again at the end.
    fn host_dir(&self, dir: &Path) -> PathBuf {
        let mut missing: Vec<PathBuf> = dir.ancestors().take_while(|a| !a.exists()).map(Path::to_path_buf).collect();
        missing.reverse();
        for d in missing {
            std::fs::create_dir(&d).unwrap();
            self.push(Undo::RemoveDir(d));
        }
        dir.into()
    }

    // --- devices ----------------------------------------------------------------------------

    /// A loop device over a new sparse image file of the lab.
    fn loop_dev(&self, name: &str, mib: u64) -> PathBuf {
        let img = self.dir("images").join(format!("{name}.img"));
        run(Command::new("truncate").arg("-s").arg(format!("{mib}M")).arg(&img));
        self.loop_on(&img)
    }

    /// A loop device over an existing file or block device.
    fn loop_on(&self, backing: &Path) -> PathBuf {
        let out = run(Command::new("losetup").args(["--find", "--show"]).arg(backing));
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

    /// A loop device with a DOS partition table of two partitions (16 MiB and the rest);
    /// returns the disk and nodes for its partitions (devtmpfs's, or made with mknod in the lab
    /// when there is no devtmpfs node).
    fn partitioned_loop(&self, name: &str, mib: u64) -> (PathBuf, Vec<PathBuf>) {
        let img = self.dir("images").join(format!("{name}.img"));
        run(Command::new("truncate").arg("-s").arg(format!("{mib}M")).arg(&img));
        let out = run(Command::new("losetup").args(["--find", "--show", "-P"]).arg(&img));
        let dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        self.push(Undo::Detach(dev.clone()));
        let mut child = Command::new("sfdisk").arg("-q").arg(&dev).stdin(Stdio::piped()).spawn().unwrap();
        child.stdin.take().unwrap().write_all(b"label: dos\n,16M\n,\n").unwrap();
        assert!(child.wait().unwrap().success(), "sfdisk {}", dev.display());
        // Without udev the kernel may not have re-read the table: ask it.
        quiet(Command::new("partx").arg("-a").arg(&dev));
        quiet(Command::new("partx").arg("-u").arg(&dev));
        let base = dev.file_name().unwrap().to_string_lossy().into_owned();
        let mut parts = Vec::new();
        for n in 1..=2 {
            let sys = PathBuf::from(format!("/sys/block/{base}/{base}p{n}/dev"));
            let start = Instant::now();
            while !sys.exists() {
                assert!(start.elapsed() < Duration::from_secs(10), "partition {n} of {} never appeared", dev.display());
                std::thread::sleep(Duration::from_millis(100));
            }
            let number = read_trim(&sys).unwrap();
            let node = PathBuf::from(format!("/dev/{base}p{n}"));
            let start = Instant::now();
            while !node.exists() && start.elapsed() < Duration::from_secs(3) {
                std::thread::sleep(Duration::from_millis(100));
            }
            let ok =
                std::fs::metadata(&node).is_ok_and(|m| m.file_type().is_block_device() && dev_text(m.rdev()) == number);
            parts.push(if ok { node } else { self.mknod(&self.dir("nodes").join(format!("{base}p{n}")), &number) });
        }
        (dev, parts)
    }

    /// `mknod path b major minor`.
    fn mknod(&self, path: &Path, number: &str) -> PathBuf {
        let (major, minor) = number.split_once(':').unwrap();
        run(Command::new("mknod").arg(path).args(["b", major, minor]));
        path.into()
    }

    fn rdev_of(dev: &Path) -> String {
        dev_text(std::fs::metadata(dev).unwrap().rdev())
    }

    /// Mounts `dev` at `target` in a new mount namespace pinned by a file of the lab: our own
    /// namespace never sees that mount.
    fn mount_in_other_namespace(&self, dev: &Path, target: &Path) {
        std::fs::create_dir_all(target).unwrap();
        // The pin file must sit on a private mount.
        let pin_dir = self.dir(&format!("ns-pin-{}", self.next()));
        self.bind(&pin_dir, &pin_dir);
        let ns = pin_dir.join("mnt");
        File::create(&ns).unwrap();
        run(Command::new("unshare")
            .arg(format!("--mount={}", ns.display()))
            .args(["--propagation", "private", "mount"])
            .arg(dev)
            .arg(target));
        self.push(Undo::NsUnmount { ns, target: target.into() });
    }

    // --- canaries ---------------------------------------------------------------------------

    fn canary_tmpfs(&self, rel: &str) -> Canary {
        let mount = self.tmpfs(&self.path(rel), 8);
        self.add_canary(mount)
    }

    fn canary_ext4(&self, rel: &str) -> Canary {
        let dev = self.loop_dev(&format!("canary-{}", self.next()), 32);
        self.mkfs("ext4", &dev);
        let mount = self.mount_dev(&dev, &self.path(rel));
        self.add_canary(mount)
    }

    fn add_canary(&self, mount: PathBuf) -> Canary {
        let file = mount.join("CANARY");
        let content = format!("canary of {} at {}: {:?}\n", self.name, mount.display(), Instant::now());
        std::fs::write(&file, &content).unwrap();
        let table = mountinfo();
        let dev = location(&mount, false, &table).expect("canary mount").0.dev;
        let c = Canary { mount, file, content, dev };
        self.canaries.borrow_mut().push(c.clone());
        c
    }

    // --- running the binary -----------------------------------------------------------------

    fn write_config(&self, classes: &[Class]) -> PathBuf {
        let dir = self.dir(&format!("config-{}", self.next()));
        let map: String = classes.iter().map(Class::yaml).collect();
        std::fs::write(dir.join("storageClassMap"), map).unwrap();
        dir
    }

    fn discover(&self, classes: &[Class]) -> Found {
        self.discover_with_stdin(classes, Stdio::null())
    }

    fn discover_with_stdin(&self, classes: &[Class], stdin: Stdio) -> Found {
        let config = self.write_config(classes);
        let out = Command::new(binary())
            .args([
                "discover",
                "--node-name",
                "safety-node",
                "--node-uid",
                "0b9d5a4c-2f4e-4c55-9a51-1a1e3c1e6f7d",
                "--output",
                "json",
            ])
            .arg("--config-dir")
            .arg(&config)
            .stdin(stdin)
            .output()
            .expect("running discover");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "discover failed: {}\n{stderr}", out.status);
        let list: Value = serde_json::from_slice(&out.stdout).expect("discover prints a JSON List");
        let items = list["items"].as_array().cloned().unwrap_or_default();
        let found = Found { items, stderr, classes: classes.to_vec() };
        self.check_invariants(&found);
        found
    }

    /// `validate-config`: whether it passed, and its stderr.
    fn validate(&self, classes: &[Class]) -> (bool, String) {
        let config = self.write_config(classes);
        let out = Command::new(binary()).args(["validate-config", "--config-dir"]).arg(&config).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    }

    // --- expectations -----------------------------------------------------------------------

    fn expect_published(&self, f: &Found, path: &Path) {
        self.check(f.is_published(path), || {
            format!(
                "{} should be published (reason given: {:?}); published: {:?}",
                path.display(),
                f.reason(path),
                f.host_paths()
            )
        });
    }

    fn expect_refused(&self, f: &Found, path: &Path, codes: &[&str]) {
        let reason = f.reason(path);
        self.check(!f.is_published(path), || format!("{} must not be published", path.display()));
        self.check(reason.as_deref().is_some_and(|r| codes.contains(&r)), || {
            format!("{} should be refused with one of {codes:?}, got {reason:?}", path.display())
        });
    }

    fn expect_nothing_published(&self, f: &Found, what: &str) {
        self.check(f.items.is_empty(), || format!("{what}: nothing may be published, got {:?}", f.host_paths()));
    }

    /// The oracle: every published PV is checked against the kernel's view (see the module
    /// documentation), whatever the test expected.
    fn check_invariants(&self, f: &Found) {
        let table = mountinfo();
        let canaries = self.canaries.borrow().clone();
        // Places no directory volume may contain: (device, path, what, also-not-inside).
        let mut places: Vec<(String, PathBuf, String, bool)> = Vec::new();
        for dir in SYSTEM_DIRS {
            if let Some((line, inside)) = location(Path::new(dir), true, &table) {
                places.push((line.dev, inside, format!("the system directory {dir}"), SENSITIVE_DIRS.contains(&dir)));
            }
        }
        for m in table.iter().filter(|m| HOST_MOUNT_AREAS.iter().any(|a| m.point.starts_with(a))) {
            places.push((m.dev.clone(), m.root.clone(), format!("the host mount {}", m.point.display()), true));
        }
        for c in &f.classes {
            if let Some((line, inside)) = location(&c.mount_dir, true, &table) {
                places.push((line.dev, inside, format!("the discovery directory of {}", c.name), false));
            }
        }
        for c in &canaries {
            places.push((c.dev.clone(), PathBuf::from("/"), format!("the canary {}", c.mount.display()), true));
        }

        let mut footprints: Vec<(String, Vec<Atom>)> = Vec::new();
        for pv in &f.items {
            let host = pv["spec"]["local"]["path"].as_str().unwrap_or_default().to_string();
            if let Some(s) = SENSITIVE_DIRS.iter().find(|s| Path::new(&host).starts_with(s)) {
                self.check(false, || format!("PV path {host} lies inside the host directory {s}"));
            }
            let Some(path) = f.agent_path(pv) else {
                self.check(false, || format!("PV {host} is of no configured class"));
                continue;
            };
            // The entry itself unresolved, its directory resolved (mountDir may be a symlink).
            let path = match (path.parent().map(std::fs::canonicalize), path.file_name()) {
                (Some(Ok(dir)), Some(name)) => dir.join(name),
                _ => path,
            };
            let Ok(meta) = std::fs::metadata(&path) else {
                self.check(false, || format!("published {} cannot be stat'ed", path.display()));
                continue;
            };
            if meta.file_type().is_block_device() {
                let dev = dev_text(meta.rdev());
                let atoms = block_atoms(&dev, &table, 0);
                for c in &canaries {
                    let canary_atoms = block_atoms(&c.dev, &table, 0);
                    let on_canary = atoms.iter().any(|a| {
                        overlap(a, &Atom::Area { dev: c.dev.clone(), path: "/".into() })
                            || canary_atoms.iter().any(|b| overlap(a, b))
                    });
                    self.check(!on_canary, || {
                        format!("block PV {host} ({dev}) holds the canary {}", c.mount.display())
                    });
                }
                if let Some(why) = block_in_use(&path, &dev, &table) {
                    self.check(false, || format!("block PV {host} ({dev}) is in use: {why}"));
                }
                footprints.push((host, atoms));
                continue;
            }
            if !meta.is_dir() {
                self.check(false, || {
                    format!("PV {host} is neither a directory nor a block device (as this test process resolves it)")
                });
                continue;
            }
            let sx = statx(&path, false);
            let line = sx.as_ref().and_then(|s| table.iter().find(|m| m.id == s.mnt_id));
            let Some(line) = line else {
                self.check(false, || format!("no mount found for published {}", path.display()));
                continue;
            };
            let is_root = sx.as_ref().and_then(|s| s.mount_root).unwrap_or(line.point == path);
            self.check(is_root && line.point == path, || {
                format!(
                    "directory PV {host} is not a mount point: what is visible there is a directory of the mount at {} ({} {} of {})",
                    line.point.display(),
                    line.fs_type,
                    line.root.display(),
                    line.dev
                )
            });
            self.check(!PSEUDO_FS.contains(&line.fs_type.as_str()), || {
                format!("directory PV {host} is a {} filesystem", line.fs_type)
            });
            let (_, inside) = location(&path, false, &table).unwrap_or((line.clone(), line.root.clone()));
            for (dev, place, what, not_inside) in &places {
                if *dev != line.dev {
                    continue;
                }
                self.check(!place.starts_with(&inside), || {
                    format!("directory PV {host} shows {} of {dev}, which contains {what}", inside.display())
                });
                self.check(!(*not_inside && inside.starts_with(place)), || {
                    format!("directory PV {host} shows {} of {dev}, which is inside {what}", inside.display())
                });
            }
            let mut atoms = vec![Atom::Area { dev: line.dev.clone(), path: inside }];
            atoms.extend(block_atoms(&line.dev, &table, 0));
            footprints.push((host, atoms));
        }
        for (i, (a, fa)) in footprints.iter().enumerate() {
            for (b, fb) in &footprints[i + 1..] {
                let shared = fa.iter().any(|x| fb.iter().any(|y| overlap(x, y)));
                self.check(!shared, || format!("PVs {a} and {b} share data ({fa:?} / {fb:?})"));
            }
        }
    }

    /// Checks the canaries and fails the test with every violation found.
    fn finish(self) {
        let table = mountinfo();
        for c in self.canaries.borrow().iter() {
            let content = std::fs::read_to_string(&c.file).unwrap_or_default();
            self.check(content == c.content, || format!("canary {} changed: {content:?}", c.file.display()));
            let mounted = table.iter().any(|m| m.point == c.mount && m.dev == c.dev);
            self.check(mounted, || format!("canary {} is no longer mounted", c.mount.display()));
        }
        let problems = self.problems.borrow().clone();
        assert!(problems.is_empty(), "{}: {} violation(s):\n- {}", self.name, problems.len(), problems.join("\n- "));
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let undo = std::mem::take(self.undo.get_mut());
        for u in undo.iter().rev() {
            u.run();
        }
        remove_scratch_dir(&self.root, self.name);
    }
}

/// Holds a block device open with O_EXCL, as mkfs or a database would.
fn hold_exclusively(dev: &Path) -> File {
    OpenOptions::new().read(true).custom_flags(OFlag::O_EXCL.bits()).open(dev).expect("open O_EXCL")
}

// =============================================================================================
// Invariant 1: what a volume is; discovery roots

#[test]
fn directory_volumes_are_mount_points_at_their_own_name_and_symlinks_only_reach_devices() {
    let _area = support::area(module_path!());
    let Some(lab) = Lab::new("entries") else { return };
    let canary = lab.canary_tmpfs("outside/canary");
    let disks = lab.dir("disks");
    let blk = lab.dir("blk");
    let outside = lab.dir("outside");

    let vol = lab.tmpfs(&disks.join("vol"), 8);
    let other_vol = lab.tmpfs(&outside.join("elsewhere"), 8);
    symlink(&canary.mount, disks.join("link-canary")).unwrap();
    symlink("/", disks.join("link-root")).unwrap();
    symlink("/etc", disks.join("link-etc")).unwrap();
    symlink("../outside/elsewhere", disks.join("link-relative")).unwrap();
    symlink(&vol, disks.join("link-to-volume")).unwrap();
    symlink(&other_vol, outside.join("hop")).unwrap();
    symlink(outside.join("hop"), disks.join("link-chain")).unwrap();
    std::fs::create_dir(disks.join("plain")).unwrap();
    std::fs::write(disks.join("plain/data"), "x").unwrap();
    // A directory inside a volume, reached through a symlink: still a symlink.
    std::fs::create_dir(vol.join("sub")).unwrap();
    symlink(vol.join("sub"), disks.join("link-into-volume")).unwrap();

    // Devices: a symlink, a chain of symlinks, a symlink to a directory, a directory.
    let free1 = lab.loop_dev("free1", 16);
    let free2 = lab.loop_dev("free2", 16);
    let free3 = lab.loop_dev("free3", 16);
    symlink(&free1, blk.join("dev-link")).unwrap();
    symlink(&free2, outside.join("dev-hop")).unwrap();
    symlink(outside.join("dev-hop"), blk.join("dev-chain")).unwrap();
    symlink(&other_vol, blk.join("dir-link")).unwrap();
    std::fs::create_dir(blk.join("a-directory")).unwrap();
    // A device symlink in a Filesystem class is a Filesystem PV kubelet formats.
    symlink(&free3, disks.join("dev-in-fs-class")).unwrap();

    let f = lab.discover(&[fs_class("fs", &disks), block_class("blk", &blk)]);
    lab.expect_published(&f, &disks.join("vol"));
    lab.expect_published(&f, &blk.join("dev-link"));
    lab.expect_published(&f, &blk.join("dev-chain"));
    lab.expect_published(&f, &disks.join("dev-in-fs-class"));
    for name in
        ["link-canary", "link-root", "link-etc", "link-relative", "link-to-volume", "link-chain", "link-into-volume"]
    {
        lab.expect_refused(&f, &disks.join(name), &["symlink"]);
    }
    lab.expect_refused(&f, &blk.join("dir-link"), &["symlink"]);
    lab.expect_refused(&f, &disks.join("plain"), &["not-mount-point"]);
    lab.expect_refused(&f, &blk.join("a-directory"), &["directory-in-block-class"]);
    lab.finish();
}

#[test]
fn discovery_roots_that_resolve_to_the_host_are_refused() {
    let _area = support::area(module_path!());
    let Some(lab) = Lab::new("unsafe-roots") else { return };
    lab.canary_tmpfs("outside/canary");
    let good = lab.dir("good");
    lab.tmpfs(&good.join("vol"), 8);
    let links = lab.dir("links");
    let hop = links.join("hop-to-var-lib");
    symlink("/var/lib", &hop).unwrap();
    let cases: Vec<(&str, PathBuf, bool)> = vec![
        ("to-root", PathBuf::from("/"), false),
        ("to-etc", PathBuf::from("/etc"), false),
        ("to-dev", PathBuf::from("/dev"), true),
        ("to-proc-self", PathBuf::from("/proc/self"), false),
        ("to-proc-root", PathBuf::from("/proc/self/root"), false),
        ("to-usr-lib", PathBuf::from("/usr/lib"), false),
        ("chain", hop.clone(), false),
    ];
    for (name, target, block) in cases {
        let link = links.join(name);
        symlink(&target, &link).unwrap();
        let class = if block { block_class("bad", &link) } else { fs_class("bad", &link) };
        let classes = [class, fs_class("good", &good)];
        let f = lab.discover(&classes);
        lab.expect_refused(&f, &link, &["unsafe-root"]);
        lab.expect_published(&f, &good.join("vol"));
        lab.check(f.items.len() == 1, || format!("root {name}: only the good volume, got {:?}", f.host_paths()));
        let (ok, err) = lab.validate(&classes);
        lab.check(!ok && err.contains("storageClassMap.bad.mountDir"), || {
            format!("validate-config must fail for a root that is a symlink to {}: {err}", target.display())
        });
    }
    lab.finish();
}

#[test]
fn classes_sharing_one_directory_are_all_refused() {
    let _area = support::area(module_path!());
    let Some(lab) = Lab::new("shared-roots") else { return };
    lab.canary_tmpfs("outside/canary");
    let a = lab.dir("disks-a");
    let vol = lab.tmpfs(&a.join("vol"), 8);
    std::fs::create_dir(vol.join("sub")).unwrap();
    // A class on a filesystem of its own, so that no construction below involves it.
    let unrelated = lab.tmpfs(&lab.path("unrelated-fs"), 8).join("root");
    std::fs::create_dir(&unrelated).unwrap();
    lab.tmpfs(&unrelated.join("vol"), 8);

    // The same directory under two names: a symlink, and a bind mount of it elsewhere.
    let link = lab.path("link-to-a");
    symlink(&a, &link).unwrap();
    let bound = lab.bind(&a, &lab.path("bind-of-a"));
    // Nested: a symlink into it, and a bind of its parent (the lab directory) elsewhere.
    lab.dir("disks-a/inner");
    let nested_link = lab.path("link-into-a");
    symlink(a.join("inner"), &nested_link).unwrap();
    let parent_bind = lab.bind(&lab.root, &lab.dir("outside/bind-of-parent"));

    for (what, other) in [
        ("a symlink to it", link),
        ("a bind mount of it", bound),
        ("a symlink into it", nested_link),
        ("a bind mount of its parent", parent_bind),
    ] {
        let classes = [fs_class("a", &a), fs_class("b", &other), fs_class("unrelated", &unrelated)];
        let f = lab.discover(&classes);
        lab.expect_refused(&f, &a, &["shared-root"]);
        lab.expect_refused(&f, &other, &["shared-root"]);
        lab.check(!f.is_published(&a.join("vol")), || format!("{what}: a volume of a refused root was published"));
        lab.expect_published(&f, &unrelated.join("vol"));
        lab.check(f.items.len() == 1, || format!("{what}: only the unrelated volume, got {:?}", f.host_paths()));
        let (ok, err) = lab.validate(&classes);
        lab.check(
            !ok && err.contains("storageClassMap.a.mountDir") && err.contains("storageClassMap.b.mountDir"),
            || format!("validate-config must fail when class b's root is {what} class a's: {err}"),
        );
    }
    lab.finish();
}

// =============================================================================================
// Invariant 2: nothing whose source is the host

#[test]
fn mounts_whose_source_is_the_host_are_refused() {
    let _area = support::area(module_path!());
    let Some(lab) = Lab::new("exposes-host") else { return };
    lab.canary_ext4("outside/canary");
    let disks = lab.dir("disks");
    let other = lab.dir("other-class");
    lab.tmpfs(&other.join("vol"), 8);
    lab.tmpfs(&disks.join("ok"), 8);

    let mut refused = vec![
        lab.bind(Path::new("/"), &disks.join("e-root")),
        lab.bind(&lab.root, &disks.join("e-parent")),
        lab.bind(&disks, &disks.join("e-self")),
        lab.bind(&other, &disks.join("e-other-class")),
        lab.bind(Path::new("/etc"), &disks.join("e-etc")),
        lab.bind(Path::new("/tmp"), &disks.join("e-tmp")),
        lab.bind(Path::new("/usr/share"), &disks.join("e-usr-share")),
        lab.bind(Path::new("/var"), &disks.join("e-var")),
        lab.rbind(Path::new("/dev"), &disks.join("e-dev")),
    ];
    // A directory created for the test in /etc and in /var/lib/kubelet, removed at the end.
    let unique = format!("lsp-safety-{}-{}", std::process::id(), lab.next());
    let etc_sub = lab.host_dir(&Path::new("/etc").join(&unique));
    refused.push(lab.bind(&etc_sub, &disks.join("e-etc-sub")));
    let kubelet_sub = lab.host_dir(&Path::new("/var/lib/kubelet").join(&unique));
    refused.push(lab.bind(&kubelet_sub, &disks.join("e-kubelet-sub")));
    for host_mount in ["/dev/shm", "/sys/fs/cgroup", "/run/lock"] {
        let p = Path::new(host_mount);
        if mountinfo().iter().any(|m| m.point == p) {
            refused.push(lab.bind(p, &disks.join(format!("e{}", host_mount.replace('/', "-")))));
        }
    }
    // Fresh kernel filesystems.
    for (fs_type, name) in [("proc", "e-proc"), ("sysfs", "e-sysfs"), ("devtmpfs", "e-devtmpfs")] {
        match lab.try_mount(fs_type, fs_type, None, &disks.join(name)) {
            Ok(p) => refused.push(p),
            Err(e) => eprintln!("note: cannot mount {fs_type} here ({e}); that case is not run"),
        }
    }

    let f = lab.discover(&[fs_class("fs", &disks), fs_class("other", &other)]);
    lab.expect_published(&f, &disks.join("ok"));
    lab.expect_published(&f, &other.join("vol"));
    for p in &refused {
        lab.expect_refused(&f, p, &["exposes-host"]);
    }
    lab.check(f.items.len() == 2, || format!("only the two tmpfs volumes, got {:?}", f.host_paths()));
    lab.finish();
}

// =============================================================================================
// Invariant 3: one disk, at most one PV

#[test]
fn one_disk_is_published_at_most_once() {
    let _area = support::area(module_path!());
    let Some(lab) = Lab::new("one-disk") else { return };
    lab.canary_tmpfs("outside/canary");
    let a = lab.dir("disks-a");
    let b = lab.dir("disks-b");
    let blk = lab.dir("disks-blk");

    // The same tmpfs at two entries.
    let shared = lab.tmpfs(&lab.path("outside/shared"), 8);
    lab.bind(&shared, &a.join("twin1"));
    lab.bind(&shared, &a.join("twin2"));
    // A volume, and a bind of its subdirectory at another entry.
    let vol = lab.tmpfs(&a.join("vol"), 8);
    std::fs::create_dir(vol.join("sub")).unwrap();
    lab.bind(&vol.join("sub"), &a.join("vol-sub"));
    // One filesystem in two classes' directories.
    let cross = lab.tmpfs(&lab.path("outside/cross"), 8);
    lab.bind(&cross, &a.join("cross"));
    lab.bind(&cross, &b.join("cross"));
    // An ext4 loop device mounted at an entry whose device node is an entry of a Block class...
    let ext_a = lab.loop_dev("ext-a", 32);
    lab.mkfs("ext4", &ext_a);
    lab.mount_dev(&ext_a, &a.join("ext"));
    symlink(&ext_a, blk.join("ext-dev")).unwrap();
    // ...or of the same Filesystem class.
    let ext_b = lab.loop_dev("ext-b", 32);
    lab.mkfs("ext4", &ext_b);
    lab.mount_dev(&ext_b, &b.join("fext"));
    symlink(&ext_b, b.join("fext-dev")).unwrap();
    // The same with XFS (no btrfs tools here, so no btrfs case).
    let xfs = tool_exists("mkfs.xfs").then(|| {
        let dev = lab.loop_dev("xfs", 320);
        lab.mkfs("xfs", &dev);
        lab.mount_dev(&dev, &a.join("xfs"));
        symlink(&dev, blk.join("xfs-dev")).unwrap();
    });
    // One free device under three names: two symlinks and a node made with mknod.
    let free = lab.loop_dev("free", 16);
    symlink(&free, blk.join("free1")).unwrap();
    symlink(&free, blk.join("free2")).unwrap();
    lab.mknod(&blk.join("free-node"), &Lab::rdev_of(&free));
    // A discovery root that is a bind of another class's volume, with a directory of that
    // volume bind-mounted onto itself as its entry.
    let vol2 = lab.tmpfs(&a.join("vol2"), 8);
    std::fs::create_dir(vol2.join("inner")).unwrap();
    let c = lab.bind(&vol2, &lab.path("disks-c"));
    lab.bind(&c.join("inner"), &c.join("inner"));
    // Controls: two different directories of one shared disk, and a volume of its own.
    let shared2 = lab.tmpfs(&lab.path("outside/shared2"), 8);
    std::fs::create_dir(shared2.join("d1")).unwrap();
    std::fs::create_dir(shared2.join("d2")).unwrap();
    lab.bind(&shared2.join("d1"), &a.join("dir1"));
    lab.bind(&shared2.join("d2"), &b.join("dir2"));
    lab.tmpfs(&b.join("solo"), 8);

    let f = lab.discover(&[fs_class("a", &a), fs_class("b", &b), block_class("blk", &blk), fs_class("c", &c)]);
    for p in [a.join("twin1"), a.join("twin2"), a.join("vol"), a.join("vol-sub"), a.join("cross"), b.join("cross")] {
        lab.expect_refused(&f, &p, &["same-disk"]);
    }
    // The volume contains class c's whole discovery directory: refused; the directory of it
    // that class c offers is then the only PV of that data.
    lab.expect_refused(&f, &a.join("vol2"), &["exposes-host", "same-disk"]);
    lab.expect_published(&f, &c.join("inner"));
    // The mounted filesystem is the volume; its device node, in use by that mount, can never
    // be published, so it does not make the filesystem ambiguous.
    let mut mounted = vec![a.join("ext"), b.join("fext")];
    let mut device_nodes = vec![blk.join("ext-dev"), b.join("fext-dev")];
    if xfs.is_some() {
        mounted.push(a.join("xfs"));
        device_nodes.push(blk.join("xfs-dev"));
    }
    for p in &device_nodes {
        lab.expect_refused(&f, p, &["device-in-use"]);
    }
    for p in &mounted {
        lab.expect_published(&f, p);
    }
    for name in ["free1", "free2", "free-node"] {
        lab.expect_refused(&f, &blk.join(name), &["same-disk"]);
    }
    for p in [a.join("dir1"), b.join("dir2"), b.join("solo")] {
        lab.expect_published(&f, &p);
    }
    let want = 4 + mounted.len();
    lab.check(f.items.len() == want, || {
        format!("only dir1, dir2, solo, c/inner and the mounted filesystems, got {:?}", f.host_paths())
    });
    lab.finish();
}

// =============================================================================================
// Invariant 4: block devices the host uses

#[test]
fn block_devices_the_host_uses_are_not_published() {
    let _area = support::area(module_path!());
    let Some(lab) = Lab::new("device-in-use") else { return };
    lab.canary_ext4("outside/canary");
    let blk = lab.dir("blk");

    // Mounted outside every discovery directory.
    let mounted = lab.loop_dev("mounted", 32);
    lab.mkfs("ext4", &mounted);
    lab.mount_dev(&mounted, &lab.path("outside/mounted"));
    symlink(&mounted, blk.join("mounted")).unwrap();
    // Mounted only in another mount namespace: our mount table never shows it.
    let ns_dev = lab.loop_dev("ns", 32);
    lab.mkfs("ext4", &ns_dev);
    lab.mount_in_other_namespace(&ns_dev, &lab.path("outside/ns-mount"));
    let ns_number = Lab::rdev_of(&ns_dev);
    lab.check(!mountinfo().iter().any(|m| m.dev == ns_number), || "the namespace's mount leaked into ours".into());
    symlink(&ns_dev, blk.join("ns-mounted")).unwrap();
    // A mounted partition makes the disk busy; its other, free partition is a volume.
    let (disk, parts) = lab.partitioned_loop("parted", 64);
    lab.mkfs("ext4", &parts[0]);
    lab.mount_dev(&parts[0], &lab.path("outside/p1"));
    symlink(&disk, blk.join("parted")).unwrap();
    symlink(&parts[1], blk.join("parted-p2")).unwrap();
    // Held by device-mapper.
    let dm_dev = lab.loop_dev("dm", 16);
    let dm_name = format!("lsp-safety-{}-{}", std::process::id(), lab.next());
    let table = format!("0 {} linear {} 0", 16 * 2048, dm_dev.display());
    let dm = Command::new("dmsetup").args(["create", &dm_name, "--table", &table]).output();
    let dm_held = match dm {
        Ok(out) if out.status.success() => {
            lab.push(Undo::DmRemove(dm_name));
            symlink(&dm_dev, blk.join("dm-held")).unwrap();
            true
        }
        Ok(out) => {
            // This kernel has no device-mapper (dmsetup: "open failed: No such device"), so
            // holders are proven by the O_EXCL and partition cases only.
            eprintln!("note: dmsetup cannot create a device here: {}", String::from_utf8_lossy(&out.stderr).trim());
            false
        }
        Err(e) => {
            eprintln!("note: no dmsetup ({e}); device-mapper case not run");
            false
        }
    };
    // Open exclusively by someone: this test.
    let held = lab.loop_dev("held", 16);
    let hold = hold_exclusively(&held);
    symlink(&held, blk.join("held")).unwrap();
    // Free.
    let free = lab.loop_dev("free", 16);
    symlink(&free, blk.join("free")).unwrap();

    let classes = [block_class("blk", &blk)];
    let f = lab.discover(&classes);
    for name in ["mounted", "ns-mounted", "parted", "held"] {
        lab.expect_refused(&f, &blk.join(name), &["device-in-use"]);
    }
    if dm_held {
        lab.expect_refused(&f, &blk.join("dm-held"), &["device-in-use"]);
    }
    lab.expect_published(&f, &blk.join("parted-p2"));
    lab.expect_published(&f, &blk.join("free"));

    // The hold was the reason: released, the device is published.
    drop(hold);
    let f = lab.discover(&classes);
    lab.expect_published(&f, &blk.join("held"));
    lab.expect_refused(&f, &blk.join("mounted"), &["device-in-use"]);

    // Nodes made with mknod in a discovery directory: of the mounted device, and of the disk
    // holding the host's root filesystem (mounted, so in use; where the sandbox does not let
    // even root open that disk, discover cannot read it and says so).
    let nodes = lab.dir("nodes-dir");
    lab.mknod(&nodes.join("mounted-node"), &Lab::rdev_of(&mounted));
    let root_dev = dev_text(std::fs::metadata("/").unwrap().dev());
    let root_is_disk = sys_block(&root_dev).exists();
    if root_is_disk {
        lab.mknod(&nodes.join("root-disk"), &root_dev);
    }
    let f = lab.discover(&[block_class("nodes", &nodes), fs_class("nodes-fs", &lab.dir("empty"))]);
    lab.expect_refused(&f, &nodes.join("mounted-node"), &["device-in-use"]);
    if root_is_disk {
        lab.expect_refused(&f, &nodes.join("root-disk"), &["device-in-use", "unreadable"]);
    }
    lab.expect_nothing_published(&f, "nodes of devices in use");
    lab.finish();
}

// =============================================================================================
// Invariant 5: ordinary volumes next to all this

#[test]
fn ordinary_volumes_are_still_published() {
    let _area = support::area(module_path!());
    let Some(lab) = Lab::new("ordinary") else { return };
    let canary = lab.canary_tmpfs("outside/canary");
    let real = lab.dir("real-disks");
    let link = lab.path("disks-link");
    symlink(&real, &link).unwrap();

    lab.tmpfs(&real.join("plain"), 8);
    lab.tmpfs(&real.join("with space"), 8);
    let shared = lab.tmpfs(&lab.path("outside/shared"), 16);
    std::fs::create_dir(shared.join("data")).unwrap();
    lab.bind(&shared.join("data"), &real.join("shared-dir"));
    let ext = lab.loop_dev("ext", 32);
    lab.mkfs("ext4", &ext);
    lab.mount_dev(&ext, &real.join("ext"));
    // Unsafe neighbours.
    lab.bind(Path::new("/"), &real.join("e-root"));
    symlink(&canary.mount, real.join("to-canary")).unwrap();

    let blk = lab.dir("blk");
    let free = lab.loop_dev("free", 16);
    symlink(&free, blk.join("free")).unwrap();
    let free2 = lab.loop_dev("free2", 16);
    lab.mknod(&blk.join("node"), &Lab::rdev_of(&free2));

    // hostDir is the link too: PV paths are under it, as the agent sees them.
    let classes = [fs_class("fs", &link), block_class("blk", &blk)];
    let f = lab.discover(&classes);
    for name in ["plain", "with space", "shared-dir", "ext"] {
        lab.expect_published(&f, &link.join(name));
    }
    lab.expect_published(&f, &blk.join("free"));
    lab.expect_published(&f, &blk.join("node"));
    lab.expect_refused(&f, &link.join("e-root"), &["exposes-host"]);
    lab.expect_refused(&f, &link.join("to-canary"), &["symlink"]);
    lab.check(f.items.len() == 6, || format!("six volumes, got {:?}", f.host_paths()));
    let (ok, err) = lab.validate(&classes);
    lab.check(ok, || format!("validate-config must accept a mountDir that is a symlink to a normal directory: {err}"));
    lab.finish();
}

// =============================================================================================
// Attacks the agent withstands

#[test]
fn odd_entry_names_do_not_confuse_the_mount_table() {
    let _area = support::area(module_path!());
    let Some(lab) = Lab::new("odd-names") else { return };
    lab.canary_tmpfs("outside/canary");
    let disks = lab.dir("disks");
    // A name with a newline, a tab, a backslash, " - " (the mountinfo separator).
    lab.tmpfs(&disks.join("new\nline"), 8);
    lab.bind(Path::new("/etc"), &disks.join("nl\netc"));
    lab.bind(Path::new("/"), &disks.join("tab\troot"));
    lab.bind(Path::new("/"), &disks.join("a - b"));
    lab.tmpfs(&disks.join("back\\slash"), 8);
    // The kernel escapes a space as \040: a mounted "x y" next to a plain "x\040y", and a
    // mounted "u\040v" next to a plain "u v".
    lab.tmpfs(&disks.join("x y"), 8);
    std::fs::create_dir(disks.join("x\\040y")).unwrap();
    lab.tmpfs(&disks.join("u\\040v"), 8);
    std::fs::create_dir(disks.join("u v")).unwrap();

    let f = lab.discover(&[fs_class("fs", &disks)]);
    for name in ["new\nline", "back\\slash", "x y", "u\\040v"] {
        lab.expect_published(&f, &disks.join(name));
    }
    for name in ["nl\netc", "tab\troot", "a - b"] {
        lab.expect_refused(&f, &disks.join(name), &["exposes-host"]);
    }
    for name in ["x\\040y", "u v"] {
        lab.expect_refused(&f, &disks.join(name), &["not-mount-point"]);
    }
    lab.finish();
}

#[test]
fn symlink_chains_through_proc_lead_only_to_what_they_resolve_to() {
    let _area = support::area(module_path!());
    let Some(lab) = Lab::new("proc-links") else { return };
    lab.canary_tmpfs("outside/canary");
    let mounted = lab.loop_dev("mounted", 32);
    lab.mkfs("ext4", &mounted);
    lab.mount_dev(&mounted, &lab.path("outside/mounted"));

    // /proc/self/fd/0 is the agent's stdin: here the mounted device.
    let blk = lab.dir("blk-fd");
    symlink("/proc/self/fd/0", blk.join("fd0")).unwrap();
    let f = lab.discover_with_stdin(&[block_class("blk", &blk)], Stdio::from(File::open(&mounted).unwrap()));
    lab.expect_refused(&f, &blk.join("fd0"), &["device-in-use", "symlink"]);
    // With /dev/null as stdin it is a character device: never followed.
    let f = lab.discover(&[block_class("blk", &blk)]);
    lab.expect_refused(&f, &blk.join("fd0"), &["symlink"]);

    // A chain through /proc/self/root to the mounted device, and through this test's own
    // descriptor table to it.
    let blk2 = lab.dir("blk-chain");
    let name = mounted.file_name().unwrap().to_string_lossy().into_owned();
    symlink(Path::new("/proc/self/root/dev").join(&name), lab.path("outside/hop")).unwrap();
    symlink(lab.path("outside/hop"), blk2.join("via-root")).unwrap();
    let f = lab.discover(&[block_class("blk", &blk2)]);
    lab.expect_refused(&f, &blk2.join("via-root"), &["device-in-use", "symlink"]);
    let blk3 = lab.dir("blk-test-fd");
    let open = File::open(&mounted).unwrap();
    use std::os::fd::AsRawFd;
    symlink(format!("/proc/{}/fd/{}", std::process::id(), open.as_raw_fd()), blk3.join("via-test-fd")).unwrap();
    let f = lab.discover(&[block_class("blk", &blk3)]);
    lab.expect_refused(&f, &blk3.join("via-test-fd"), &["device-in-use", "symlink"]);
    drop(open);

    // Directories through /proc: never followed.
    let disks = lab.dir("disks");
    symlink("/proc/self/root", disks.join("proc-root")).unwrap();
    symlink("/proc/self/cwd", disks.join("proc-cwd")).unwrap();
    symlink("/proc/1/root", disks.join("pid1-root")).unwrap();
    let f = lab.discover(&[fs_class("fs", &disks)]);
    for n in ["proc-root", "proc-cwd", "pid1-root"] {
        lab.expect_refused(&f, &disks.join(n), &["symlink"]);
    }
    lab.expect_nothing_published(&f, "symlinks through /proc to directories");
    lab.finish();
}

#[test]
fn files_and_device_nodes_bind_mounted_onto_entries() {
    let _area = support::area(module_path!());
    let Some(lab) = Lab::new("file-binds") else { return };
    let canary = lab.canary_tmpfs("outside/canary");
    let disks = lab.dir("disks");
    let mounted = lab.loop_dev("mounted", 32);
    lab.mkfs("ext4", &mounted);
    lab.mount_dev(&mounted, &lab.path("outside/mounted"));
    let free = lab.loop_dev("free", 16);

    lab.bind_file(Path::new("/etc/hostname"), &disks.join("file-etc"));
    lab.bind_file(&canary.file, &disks.join("file-canary"));
    lab.bind_file(&mounted, &disks.join("node-mounted"));
    lab.bind_file(&free, &disks.join("node-free"));

    let f = lab.discover(&[fs_class("fs", &disks)]);
    lab.expect_refused(&f, &disks.join("file-etc"), &["not-directory-or-block-device"]);
    lab.expect_refused(&f, &disks.join("file-canary"), &["not-directory-or-block-device"]);
    lab.expect_refused(&f, &disks.join("node-mounted"), &["device-in-use"]);
    // A device node is the device wherever it is mounted: a (Filesystem-mode) device volume.
    lab.expect_published(&f, &disks.join("node-free"));
    lab.finish();
}

#[test]
fn overlays_kernel_filesystems_and_other_namespaces_are_not_volumes() {
    let _area = support::area(module_path!());
    let Some(lab) = Lab::new("kernel-fs") else { return };
    let canary = lab.canary_tmpfs("outside/canary");
    let disks = lab.dir("disks");
    let mut refused = Vec::new();
    for (lower, name) in [(PathBuf::from("/etc"), "overlay-etc"), (canary.mount.clone(), "overlay-canary")] {
        let upper = lab.dir(&format!("overlay/{name}/upper"));
        let work = lab.dir(&format!("overlay/{name}/work"));
        let opts = format!("lowerdir={},upperdir={},workdir={}", lower.display(), upper.display(), work.display());
        match lab.try_mount("overlay", "overlay", Some(&opts), &disks.join(name)) {
            Ok(p) => refused.push(p),
            Err(e) => eprintln!("note: overlay not mountable here ({e})"),
        }
    }
    for (fs_type, opts) in [
        ("ramfs", None),
        ("devpts", Some("newinstance")),
        ("mqueue", None),
        ("cgroup2", None),
        ("tracefs", None),
        ("bpf", None),
        ("hugetlbfs", None),
    ] {
        match lab.try_mount(fs_type, fs_type, opts, &disks.join(format!("k-{fs_type}"))) {
            Ok(p) => refused.push(p),
            Err(e) => eprintln!("note: {fs_type} not mountable here ({e})"),
        }
    }
    // A tmpfs mounted at an entry in another mount namespace only: a plain directory here.
    let other_ns = lab.dir("disks/other-ns");
    let pin_dir = lab.dir("ns-pin");
    lab.bind(&pin_dir, &pin_dir);
    let ns = pin_dir.join("mnt");
    File::create(&ns).unwrap();
    run(Command::new("unshare")
        .arg(format!("--mount={}", ns.display()))
        .args(["--propagation", "private", "mount", "-t", "tmpfs", "tmpfs"])
        .arg(&other_ns));
    lab.push(Undo::NsUnmount { ns, target: other_ns.clone() });

    let f = lab.discover(&[fs_class("fs", &disks)]);
    lab.check(!refused.is_empty(), || "no kernel filesystem could be mounted: nothing proven".into());
    for p in &refused {
        lab.expect_refused(&f, p, &["exposes-host"]);
    }
    lab.expect_refused(&f, &other_ns, &["not-mount-point"]);
    lab.expect_nothing_published(&f, "kernel filesystems");
    lab.finish();
}

#[test]
fn mounts_nested_inside_a_volume_are_not_volumes_of_their_own() {
    let _area = support::area(module_path!());
    let Some(lab) = Lab::new("nested") else { return };
    let canary = lab.canary_tmpfs("outside/canary");
    let disks = lab.dir("disks");
    let outer = lab.tmpfs(&disks.join("outer"), 8);
    lab.bind(Path::new("/"), &outer.join("root"));
    lab.rbind(canary.mount.parent().unwrap(), &outer.join("outside"));
    let plain = lab.dir("disks/plain");
    lab.tmpfs(&plain.join("inner"), 8);

    let f = lab.discover(&[fs_class("fs", &disks)]);
    for p in [outer.join("root"), outer.join("outside"), plain.join("inner")] {
        lab.check(!f.is_published(&p), || format!("{} is not a first-level entry", p.display()));
    }
    lab.expect_refused(&f, &plain, &["not-mount-point"]);
    // The outer tmpfs has / mounted inside it: a pod whose volume is bound in recursively
    // would see the host root, so it is refused like a bind of / itself.
    lab.expect_refused(&f, &outer, &["exposes-host"]);
    assert!(f.stderr.contains("the mount inside it at"), "{}", f.stderr);
    lab.finish();
}

#[test]
fn covering_the_discovery_directory_or_its_parent_without_name_clashes() {
    let _area = support::area(module_path!());
    let Some(lab) = Lab::new("covered") else { return };
    lab.canary_tmpfs("outside/canary");
    let parent = lab.dir("parent");
    let disks = lab.dir("parent/disks");
    lab.tmpfs(&disks.join("old"), 8);
    // A tmpfs on top of the discovery directory: the old volume is hidden, the new tmpfs's
    // plain directory is not a volume, a mount made in it is.
    lab.tmpfs(&disks, 16);
    std::fs::create_dir(disks.join("plain")).unwrap();
    lab.tmpfs(&disks.join("new"), 8);
    let f = lab.discover(&[fs_class("fs", &disks)]);
    lab.expect_published(&f, &disks.join("new"));
    lab.expect_refused(&f, &disks.join("plain"), &["not-mount-point"]);
    lab.check(!f.is_published(&disks.join("old")), || "a hidden volume was published".into());

    // A directory with a symlink `disks` -> / mounted over the parent: the root now resolves
    // to / and is refused.
    let decoy = lab.dir("decoy");
    symlink("/", decoy.join("disks")).unwrap();
    lab.bind(&decoy, &parent);
    let f = lab.discover(&[fs_class("fs", &disks)]);
    lab.expect_refused(&f, &disks, &["unsafe-root"]);
    lab.expect_nothing_published(&f, "a root turned into a symlink to /");

    // An empty tmpfs over the parent: the root is gone.
    lab.tmpfs(&parent, 8);
    let f = lab.discover(&[fs_class("fs", &disks)]);
    lab.expect_refused(&f, &disks, &["unreadable-directory"]);
    lab.expect_nothing_published(&f, "a root that is gone");
    lab.finish();
}

// =============================================================================================
// Attacks that get something published that must not be (these tests fail until fixed)

/// A discovery directory that is a system directory through a mount rather than a symlink:
/// `/dev` bind-mounted (or a fresh devtmpfs mounted) over it publishes every free block device
/// of the host; `/` bind-mounted over it makes the host root the discovery directory. The root
/// check looks at the canonical path's text only, and validate-config passes.
#[test]
fn a_root_that_is_a_system_directory_through_a_mount_is_refused() {
    let _area = support::area(module_path!());
    let Some(lab) = Lab::new("mounted-roots") else { return };
    lab.canary_tmpfs("outside/canary");
    // A free device of this test, so that something would be published; the pattern keeps
    // discover from probing anybody else's devices in /dev.
    let free = lab.loop_dev("free", 16);
    let name = free.file_name().unwrap().to_string_lossy().into_owned();

    let dev_bind = lab.dir("dev-bind");
    lab.bind(Path::new("/dev"), &dev_bind);
    let devtmpfs = lab.dir("devtmpfs");
    let devtmpfs_ok = lab.try_mount("devtmpfs", "devtmpfs", None, &devtmpfs).is_ok();
    let root_bind = lab.dir("root-bind");
    lab.bind(Path::new("/"), &root_bind);

    let mut cases = vec![("/dev bound over it", block_class("dev", &dev_bind).pattern(&name))];
    if devtmpfs_ok {
        cases.push(("a devtmpfs mounted on it", block_class("dev", &devtmpfs).pattern(&name)));
    }
    cases.push(("/ bound over it", fs_class("root", &root_bind)));
    for (what, class) in cases {
        let classes = [class.clone()];
        let f = lab.discover(&classes);
        lab.expect_refused(&f, &class.mount_dir, &["unsafe-root"]);
        lab.expect_nothing_published(&f, what);
        let (ok, err) = lab.validate(&classes);
        lab.check(!ok, || format!("validate-config must fail for a discovery directory with {what}: {err}"));
    }
    lab.finish();
}

/// The mount table lists mounts that are hidden under a later mount on the discovery
/// directory or its parent. The agent looks the entry's path up in the table and takes the
/// hidden mount for the entry, so a plain directory of whatever covers the discovery directory
/// is published: of the root disk after the common `mount --bind /mnt/disks /mnt/disks`, of a
/// canary bound over the directory or its parent, and the host's /etc when / is bound over it.
#[test]
fn hidden_mounts_under_a_covered_discovery_directory_are_not_volumes() {
    let _area = support::area(module_path!());
    let Some(lab) = Lab::new("hidden-mounts") else { return };

    // 1. The discovery directory bind-mounted onto itself after its volumes were mounted.
    let disks = lab.dir("self/disks");
    lab.tmpfs(&disks.join("vol"), 8);
    lab.bind(&disks, &disks);
    let f = lab.discover(&[fs_class("fs", &disks)]);
    lab.expect_refused(&f, &disks.join("vol"), &["not-mount-point"]);

    // 2. A canary holding a directory `e` bound over the discovery directory, whose `e` had a
    //    tmpfs mounted.
    let canary = lab.canary_tmpfs("outside/canary");
    std::fs::create_dir(canary.mount.join("e")).unwrap();
    std::fs::write(canary.mount.join("e/secret"), "canary data").unwrap();
    let disks2 = lab.dir("over/disks");
    lab.tmpfs(&disks2.join("e"), 8);
    lab.bind(&canary.mount, &disks2);
    let f = lab.discover(&[fs_class("fs", &disks2)]);
    lab.expect_refused(&f, &disks2.join("e"), &["not-mount-point"]);

    // 3. The same through the parent: a canary holding `disks/e` bound over the parent.
    let canary2 = lab.canary_tmpfs("outside/canary2");
    std::fs::create_dir_all(canary2.mount.join("disks/e")).unwrap();
    std::fs::write(canary2.mount.join("disks/e/secret"), "canary data").unwrap();
    let parent = lab.dir("parent");
    let disks3 = lab.dir("parent/disks");
    lab.tmpfs(&disks3.join("e"), 8);
    lab.bind(&canary2.mount, &parent);
    let f = lab.discover(&[fs_class("fs", &disks3)]);
    lab.expect_refused(&f, &disks3.join("e"), &["not-mount-point"]);

    // 4. The host root bound over a discovery directory whose `etc` had a tmpfs mounted:
    //    the host's /etc would be published.
    let disks4 = lab.dir("host/disks");
    lab.tmpfs(&disks4.join("etc"), 8);
    lab.bind(Path::new("/"), &disks4);
    let f = lab.discover(&[fs_class("fs", &disks4)]);
    lab.check(!f.is_published(&disks4.join("etc")), || {
        format!("{} (the host's /etc) was published", disks4.join("etc").display())
    });
    lab.expect_nothing_published(&f, "the host root over the discovery directory");
    lab.finish();
}

/// Two mounts stacked on one entry: the one on top is what the path shows, but the mount table
/// lists mounts by ID, so when an older mount is moved on top (`mount --move`) the agent judges
/// the one underneath. A bind of /etc (or of a canary) moved onto a tmpfs entry is published.
#[test]
fn the_mount_on_top_of_a_stack_is_the_one_judged() {
    let _area = support::area(module_path!());
    let Some(lab) = Lab::new("stacked-mounts") else { return };
    let canary = lab.canary_tmpfs("outside/canary");
    let disks = lab.dir("disks");

    // A filesystem mounted outside and also bound into the discovery directory is the
    // shared-disk recipe and may be published, so only a host directory is stacked here;
    // the canary is stacked underneath, where the mount table's path lookup used to see it.
    let _ = &canary;
    {
        let (name, source) = ("etc-on-top", PathBuf::from("/etc"));
        let stage = lab.dir(&format!("stage/{name}"));
        lab.bind(&source, &stage); // older mount ID
        lab.tmpfs(&disks.join(name), 8); // newer mount ID, underneath
        lab.move_mount(&stage, &disks.join(name)); // the older one now on top
    }
    // Control: stacked the usual way round (newer on top) it is refused.
    lab.tmpfs(&disks.join("etc-newer"), 8);
    lab.bind(Path::new("/etc"), &disks.join("etc-newer"));

    let f = lab.discover(&[fs_class("fs", &disks)]);
    for name in ["etc-on-top", "etc-newer"] {
        lab.expect_refused(&f, &disks.join(name), &["exposes-host"]);
    }
    lab.expect_nothing_published(&f, "stacked mounts");
    lab.finish();
}

/// A disk and its partitions are one disk: with all of them free, the whole disk and each
/// partition are published as separate PVs (wiping the disk's PV destroys the others).
#[test]
fn a_disk_and_its_partitions_are_one_disk() {
    let _area = support::area(module_path!());
    let Some(lab) = Lab::new("partitions") else { return };
    lab.canary_tmpfs("outside/canary");
    let (disk, parts) = lab.partitioned_loop("parted", 64);
    let blk = lab.dir("blk");
    symlink(&disk, blk.join("whole")).unwrap();
    symlink(&parts[0], blk.join("part1")).unwrap();
    symlink(&parts[1], blk.join("part2")).unwrap();
    let f = lab.discover(&[block_class("blk", &blk)]);
    lab.check(!f.is_published(&blk.join("whole")) || f.items.len() == 1, || {
        format!("the whole disk and its partitions were published: {:?}", f.host_paths())
    });

    // The disk in a Block class, a partition (a node made with mknod) in a Filesystem class.
    let (disk2, parts2) = lab.partitioned_loop("parted2", 64);
    let blk2 = lab.dir("blk2");
    let fs2 = lab.dir("fs2");
    symlink(&disk2, blk2.join("whole")).unwrap();
    lab.mknod(&fs2.join("part1"), &Lab::rdev_of(&parts2[0]));
    let f = lab.discover(&[block_class("blk", &blk2), fs_class("fs", &fs2)]);
    lab.check(f.items.len() <= 1, || format!("a disk and its partition were both published: {:?}", f.host_paths()));
    lab.finish();
}

/// A loop device is the disk of its backing file: one backed by a file inside a published
/// volume, a second loop device over the image of a mounted one, and a loop device over a loop
/// device are all published next to the volume whose data they are.
#[test]
fn a_loop_device_shares_the_disk_of_its_backing_file() {
    let _area = support::area(module_path!());
    let Some(lab) = Lab::new("loop-backing") else { return };
    lab.canary_tmpfs("outside/canary");
    let fs = lab.dir("fs");
    let blk = lab.dir("blk");
    let classes = [fs_class("fs", &fs), block_class("blk", &blk)];

    // 1. A loop device over a file inside a tmpfs volume.
    let vol = lab.tmpfs(&fs.join("vol"), 64);
    run(Command::new("truncate").args(["-s", "32M"]).arg(vol.join("disk.img")));
    let inner = lab.loop_on(&vol.join("disk.img"));
    symlink(&inner, blk.join("loop-in-vol")).unwrap();
    let f = lab.discover(&classes);
    lab.check(!(f.is_published(&vol) && f.is_published(&blk.join("loop-in-vol"))), || {
        "a volume and a loop device over a file inside it were both published".into()
    });

    // 2. Two loop devices over one image; the first holds an ext4 mounted as a volume.
    let img = lab.dir("images").join("twice.img");
    run(Command::new("truncate").args(["-s", "32M"]).arg(&img));
    let first = lab.loop_on(&img);
    let second = lab.loop_on(&img);
    lab.mkfs("ext4", &first);
    lab.mount_dev(&first, &fs.join("ext"));
    symlink(&second, blk.join("same-image")).unwrap();
    let f = lab.discover(&classes);
    lab.expect_refused(&f, &blk.join("same-image"), &["device-in-use", "same-disk"]);

    // 3. A loop device over a free loop device: both in the Block class.
    let lower = lab.loop_dev("lower", 16);
    let upper = lab.loop_on(&lower);
    symlink(&lower, blk.join("lower")).unwrap();
    symlink(&upper, blk.join("upper")).unwrap();
    let f = lab.discover(&classes);
    lab.check(!(f.is_published(&blk.join("lower")) && f.is_published(&blk.join("upper"))), || {
        "a loop device and the loop device under it were both published".into()
    });
    lab.finish();
}

/// hostDir inside a sensitive host directory (/etc, /var/lib/kubelet/pods): PVs whose paths
/// kubelet resolves inside the host's own directories are published and validate-config
/// accepts the config (only exact system directories are refused).
#[test]
fn a_host_dir_inside_a_sensitive_directory_is_refused() {
    let _area = support::area(module_path!());
    let Some(lab) = Lab::new("sensitive-host-dir") else { return };
    lab.canary_tmpfs("outside/canary");
    let disks = lab.dir("disks");
    lab.tmpfs(&disks.join("vol"), 8);
    for host in ["/etc/lsp-disks", "/var/lib/kubelet/pods", "/dev/disk/by-id", "/run/disks"] {
        let classes = [fs_class("fs", &disks).host(host)];
        // The class is refused (a config's other classes would still run): discover publishes
        // nothing of it, says why, and fails.
        let config = lab.write_config(&classes);
        let out = Command::new(binary())
            .args(["discover", "--node-name", "safety-node", "--output", "json", "--config-dir"])
            .arg(&config)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        lab.check(
            !out.status.success()
                && serde_json::from_slice::<serde_json::Value>(&out.stdout)
                    .is_ok_and(|l| l["items"] == serde_json::json!([]))
                && stderr.contains("inside the host directory"),
            || format!("discover must refuse hostDir {host}: {stderr}"),
        );
        let (ok, err) = lab.validate(&classes);
        lab.check(!ok, || format!("validate-config must refuse hostDir {host}: {err}"));
    }
    lab.finish();
}

/// A symlink through /proc/self (or /proc/thread-self) resolves to a different file in every
/// process: the agent publishes the device its own stdin is, while kubelet and the cleaner
/// will each open their own.
#[test]
fn a_device_that_depends_on_who_resolves_it_is_not_published() {
    let _area = support::area(module_path!());
    let Some(lab) = Lab::new("proc-self") else { return };
    lab.canary_tmpfs("outside/canary");
    let free = lab.loop_dev("free", 16);
    let blk = lab.dir("blk");
    symlink("/proc/self/fd/0", blk.join("self-fd0")).unwrap();
    let f = lab.discover_with_stdin(&[block_class("blk", &blk)], Stdio::from(File::open(&free).unwrap()));
    lab.check(!f.is_published(&blk.join("self-fd0")), || {
        "a symlink to /proc/self/fd/0 (the agent's stdin, a free loop device) was published".into()
    });
    lab.finish();
}

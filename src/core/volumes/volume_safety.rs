//! The data-safety rules of discovery, as pure functions over facts the host module gathers:
//! which discovery roots may be scanned, which mounts may never be offered because their
//! source is the host itself, and when two entries are one disk. Keeping them pure lets every
//! combination be tested without a disk, and keeps the rules in one place for the scanner, the
//! `discover` dry run and the agent.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Directories that must never be a discovery root, and that no volume may contain: every
/// entry below them would be offered (and later wiped) as a volume.
pub(crate) const SYSTEM_DIRS: [&str; 20] = [
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

/// Directories whose contents are the host's own (binaries, credentials, kernel interfaces,
/// other pods' volumes): a volume may not even be a subdirectory of one of them.
pub(crate) const SENSITIVE_DIRS: [&str; 18] = [
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/sys",
    "/usr",
    "/var/lib/containerd",
    "/var/lib/kubelet",
    "/var/log",
    "/var/run",
];

/// Host areas whose every mount is the host's own (kernel interfaces, shared memory, boot and
/// runtime state): a volume may neither contain nor lie inside any filesystem mounted there.
/// Kubelet's pod directories are left out on purpose: kubelet bind-mounts published volumes
/// there, and those mounts are the volumes themselves.
pub(crate) const HOST_MOUNT_AREAS: [&str; 7] = ["/boot", "/dev", "/etc", "/proc", "/run", "/sys", "/var/run"];

/// Kernel interfaces: never a tenant's disk, and never where a discovery directory may live
/// (a Block class on a devtmpfs would offer every device of the host).
pub(crate) const KERNEL_FS_TYPES: [&str; 21] = [
    "autofs",
    "binfmt_misc",
    "bpf",
    "cgroup",
    "cgroup2",
    "configfs",
    "debugfs",
    "devpts",
    "devtmpfs",
    "efivarfs",
    "fusectl",
    "hugetlbfs",
    "mqueue",
    "nsfs",
    "proc",
    "pstore",
    "rpc_pipefs",
    "securityfs",
    "selinuxfs",
    "sysfs",
    "tracefs",
];

/// Container layers and memory-only filesystems without limits: a discovery directory may
/// live on one (a test, a container's root), but such a mount is never offered as a volume.
pub(crate) const NOT_A_DISK_FS_TYPES: [&str; 2] = ["overlay", "ramfs"];

/// One mount as the safety rules see it (a borrowed view of a mount-table line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MountFacts<'a> {
    /// `major:minor` of the filesystem.
    pub device: &'a str,
    /// The directory of the filesystem that is mounted (`/` unless a bind of a subdirectory).
    pub root: &'a Path,
    /// Where it is mounted in our namespace.
    pub mount_point: &'a Path,
    /// Filesystem type.
    pub fs_type: &'a str,
}

/// Where a directory really lives: a filesystem (by device) and the path inside it. Two paths
/// with the same location are the same directory, whatever mounts and symlinks lead there.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Location {
    /// `major:minor` of the filesystem.
    pub device: String,
    /// Absolute path inside that filesystem.
    pub path: PathBuf,
}

/// The location of the canonical path `path`: the deepest mount containing it, and the path
/// below that mount's root. `None` when no mount contains it (an incomplete table).
pub(crate) fn locate(mounts: &[MountFacts<'_>], path: &Path) -> Option<Location> {
    let mount = containing_mount(mounts, path)?;
    let rest = path.strip_prefix(mount.mount_point).ok()?;
    Some(Location { device: mount.device.to_string(), path: join_inside(mount.root, rest) })
}

/// The deepest mount whose mount point contains the canonical path `path`.
pub(crate) fn containing_mount<'a, 'b>(mounts: &'a [MountFacts<'b>], path: &Path) -> Option<&'a MountFacts<'b>> {
    mounts.iter().filter(|m| path.starts_with(m.mount_point)).max_by_key(|m| m.mount_point.components().count())
}

fn join_inside(root: &Path, rest: &Path) -> PathBuf {
    if rest.as_os_str().is_empty() { root.to_path_buf() } else { root.join(rest) }
}

/// Where under `/dev` a class may keep its discovery directory: `/dev/disk/<name>` (or below
/// it) for a `<name>` that is not udev's (`by-id`, `by-path`, every `by-*`), such as the
/// `/dev/disk/kubernetes` an EKS udev rule fills with links to instance-store disks (upstream's
/// example uses it in a Filesystem class: kubelet formats each disk). Everything else under
/// `/dev` is the kernel's or udev's (`/dev` itself, `/dev/disk/by-id`, `/dev/mapper`, an LVM
/// volume group's directory): a discovery root there would offer disks nobody set aside. Each
/// entry is still judged by the usual rules: a block device not in use, held or published
/// already; anything mounted under `/dev` is the host's own, so no mount there is offered.
pub(crate) fn dedicated_dev_dir(resolved: &Path) -> bool {
    let Ok(rest) = resolved.strip_prefix("/dev/disk") else { return false };
    match rest.components().next() {
        Some(std::path::Component::Normal(name)) => {
            let name = name.to_string_lossy();
            !name.starts_with("by-") && !name.starts_with('.')
        }
        _ => false,
    }
}

/// What a refused discovery directory under `/dev` is told to use instead, as a suffix to
/// its refusal; empty for any other directory.
pub(crate) fn dev_root_advice(dir: &Path) -> &'static str {
    if dir.starts_with("/dev") {
        " (a class may use a directory of its own under /dev/disk, such as /dev/disk/kubernetes, but none of \
         the by-* ones udev fills; a `devices` section is the better way to claim raw disks)"
    } else {
        ""
    }
}

/// Why a discovery root (after resolving symlinks) may not be scanned at all.
pub(crate) fn root_problem(resolved: &Path) -> Option<String> {
    if dedicated_dev_dir(resolved) {
        return None;
    }
    let text = resolved.to_string_lossy();
    let problem = if SYSTEM_DIRS.contains(&text.as_ref()) {
        format!("resolves to the system directory {text}; it cannot be a discovery root")
    } else if ["/proc", "/sys"].iter().any(|p| resolved.starts_with(p)) {
        format!("resolves to {text}, inside a kernel pseudo-filesystem")
    } else {
        let s = SENSITIVE_DIRS.iter().find(|s| resolved.starts_with(s))?;
        format!("resolves to {text}, inside the host directory {s}; it cannot be a discovery root")
    };
    Some(problem + dev_root_advice(resolved))
}

/// Why a discovery root must not be scanned although its resolved path looks harmless: it
/// lives on a kernel filesystem (a bind of `/dev`), or where it really lives (device and
/// path in the filesystem, found through the mount that contains it) is the host root, a
/// system directory or inside a sensitive one (a bind of `/` or `/etc` at an innocent name),
/// or its hostDir is inside a sensitive host directory.
///
/// `dedicated`: the root resolved to a [`dedicated_dev_dir`]. It is accepted
/// on the host's devtmpfs only where it really is that directory of it (`/disk/<name>` inside
/// the devtmpfs, whether seen through `/dev` or a bind of just that directory), never a bind
/// of the whole of `/dev` or of anything else put there.
pub(crate) fn root_source_problem(
    mount: &MountFacts<'_>,
    location: &Location,
    host_dir: &Path,
    places: &[ProtectedPlace],
    dedicated: Option<&Path>,
) -> Option<String> {
    if let Some(resolved) = dedicated
        && mount.fs_type == "devtmpfs"
        && resolved.strip_prefix("/dev").is_ok_and(|rest| location.path == Path::new("/").join(rest))
    {
        return None;
    }
    if KERNEL_FS_TYPES.contains(&mount.fs_type) {
        return Some(format!("is on a {} filesystem (a kernel interface, not disks)", mount.fs_type));
    }
    let view = MountFacts {
        device: &location.device,
        root: &location.path,
        mount_point: mount.mount_point,
        fs_type: mount.fs_type,
    };
    let anchor = host_anchor(host_dir, location);
    exposure(&view, places, anchor.as_slice(), &[]).map(|p| p.replacen("its mount source", "its source", 1))
}

/// A class's discovery root as found on this pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RootFacts {
    /// StorageClass name.
    pub class: String,
    /// The root with every symlink resolved.
    pub resolved: PathBuf,
    /// Device and inode of the root directory.
    pub dev_ino: (u64, u64),
    /// Where the root lives (filesystem and path in it), when the mount table shows it.
    pub location: Option<Location>,
}

/// Classes whose roots are the same directory (by resolved path, by device and inode, or by
/// location) or nest inside one another: every volume would be published once per class, or a
/// whole discovery directory offered as a volume of another. None of them is scanned, since
/// no one of them is more right than the others.
///
/// Each class's reason names the first other class in `roots` order it conflicts with, as a
/// pairwise comparison would; that class is found through sorted path keys instead, so a node
/// with thousands of classes is checked in near-linear time on every pass. Class names are
/// expected to be unique (they are the keys of `storageClassMap`).
pub(crate) fn shared_roots(roots: &[RootFacts]) -> BTreeMap<String, String> {
    let same_inode = first_other_in_groups(roots.iter().map(|r| r.dev_ino));
    let nested_paths = first_prefix_related(
        roots.iter().map(|r| Some(r.resolved.components().map(KeyPart::Component).collect())).collect(),
    );
    let nested_locations = first_prefix_related(
        roots
            .iter()
            .map(|r| {
                r.location.as_ref().map(|l| {
                    std::iter::once(KeyPart::Device(&l.device))
                        .chain(l.path.components().map(KeyPart::Component))
                        .collect()
                })
            })
            .collect(),
    );
    let mut problems = BTreeMap::new();
    for (i, a) in roots.iter().enumerate() {
        let first = [same_inode[i], nested_paths[i], nested_locations[i]].into_iter().flatten().min();
        if let Some(p) = first.and_then(|b| root_pair_problem(a, &roots[b])) {
            problems.entry(a.class.clone()).or_insert(p);
        }
    }
    problems
}

/// Why roots `a` and `b` of two classes cannot both be scanned, from `a`'s side.
fn root_pair_problem(a: &RootFacts, b: &RootFacts) -> Option<String> {
    if a.class == b.class {
        return None;
    }
    let same = a.resolved == b.resolved || a.dev_ino == b.dev_ino || (a.location.is_some() && a.location == b.location);
    if same {
        Some(format!("its discovery directory is the same directory as class {:?}'s", b.class))
    } else if a.resolved.starts_with(&b.resolved) || b.resolved.starts_with(&a.resolved) {
        Some(format!("its discovery directory and class {:?}'s are nested", b.class))
    } else {
        match (&a.location, &b.location) {
            (Some(la), Some(lb))
                if la.device == lb.device && (la.path.starts_with(&lb.path) || lb.path.starts_with(&la.path)) =>
            {
                Some(format!("its discovery directory and class {:?}'s are nested (through a bind mount)", b.class))
            }
            _ => None,
        }
    }
}

/// One element of a sort key for a path: its components, after the device it lives on when
/// the path is a location. Comparing keys element by element is `Path::starts_with`'s
/// component-wise comparison, so `/mnt/disk2` is not under `/mnt/disk`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum KeyPart<'a> {
    Device(&'a str),
    Component(std::path::Component<'a>),
}

/// For each item, the smallest index of another item with the same key.
fn first_other_in_groups<K: std::hash::Hash + Eq>(keys: impl Iterator<Item = K>) -> Vec<Option<usize>> {
    let keys: Vec<K> = keys.collect();
    // The two smallest indices per key: the first is everyone's answer but its own.
    let mut smallest: std::collections::HashMap<&K, (usize, Option<usize>)> = std::collections::HashMap::new();
    for (i, k) in keys.iter().enumerate() {
        smallest.entry(k).and_modify(|e| e.1 = e.1.or(Some(i))).or_insert((i, None));
    }
    keys.iter().enumerate().map(|(i, k)| smallest.get(k).and_then(|&(a, b)| if a == i { b } else { Some(a) })).collect()
}

/// For each item with a key, the smallest index of another item whose key equals it, is a
/// prefix of it, or has it as a prefix (the same, an enclosing or an enclosed directory).
/// Sorted keys put every key's extensions in one run right after it, so one walk with a stack
/// of the current key's prefixes finds them: O(n log n) comparisons instead of n².
fn first_prefix_related<K: Ord>(keys: Vec<Option<Vec<K>>>) -> Vec<Option<usize>> {
    let mut order: Vec<usize> = (0..keys.len()).filter(|&i| keys[i].is_some()).collect();
    order.sort_by(|&a, &b| keys[a].cmp(&keys[b]).then(a.cmp(&b)));
    // Runs of equal keys; indices within a run ascend, so its first two are its smallest.
    let runs: Vec<&[usize]> = order.chunk_by(|&a, &b| keys[a] == keys[b]).collect();
    let key = |run: &[usize]| keys[run[0]].as_deref().unwrap_or_default();
    let min = |a: Option<usize>, b: Option<usize>| match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    // Smallest index among each run's strict prefixes, and among its strict extensions.
    let mut above = vec![None; runs.len()];
    let mut below = vec![None; runs.len()];
    // (run, smallest index in it and its prefixes, smallest index among its extensions so far)
    let mut stack: Vec<(usize, usize, Option<usize>)> = Vec::new();
    let close = |stack: &mut Vec<(usize, usize, Option<usize>)>, below: &mut Vec<Option<usize>>| {
        if let Some((run, _, inside)) = stack.pop() {
            below[run] = inside;
            if let Some(parent) = stack.last_mut() {
                parent.2 = min(parent.2, min(inside, Some(runs[run][0])));
            }
        }
    };
    for r in 0..runs.len() {
        while let Some(&(top, _, _)) = stack.last() {
            let (prefix, k) = (key(runs[top]), key(runs[r]));
            if k.len() >= prefix.len() && k[..prefix.len()] == *prefix {
                break;
            }
            close(&mut stack, &mut below);
        }
        above[r] = stack.last().map(|t| t.1);
        stack.push((r, above[r].map_or(runs[r][0], |a| a.min(runs[r][0])), None));
    }
    while !stack.is_empty() {
        close(&mut stack, &mut below);
    }
    let mut first = vec![None; keys.len()];
    for (r, run) in runs.iter().enumerate() {
        let related = min(above[r], below[r]);
        for &i in run.iter() {
            let same = if i == run[0] { run.get(1).copied() } else { Some(run[0]) };
            first[i] = min(same, related);
        }
    }
    first
}

/// A place no volume may expose: the host root, a system directory or a discovery directory,
/// as seen in the agent's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProtectedPlace {
    /// What it is, for the reason text (`the discovery directory /mnt/disks`).
    pub what: String,
    /// Where it lives.
    pub location: Location,
    /// Whether a volume inside it is refused too (sensitive directories), not only one
    /// containing it.
    pub no_volume_inside: bool,
}

/// The mounts in [`HOST_MOUNT_AREAS`] as protected places (their whole mounted directory).
pub(crate) fn host_area_places(mounts: &[MountFacts<'_>]) -> Vec<ProtectedPlace> {
    mounts
        .iter()
        .filter(|m| HOST_MOUNT_AREAS.iter().any(|a| m.mount_point.starts_with(a)))
        .map(|m| ProtectedPlace {
            what: format!("the host's mount {}", m.mount_point.display()),
            location: Location { device: m.device.to_string(), path: m.root.to_path_buf() },
            no_volume_inside: true,
        })
        .collect()
}

/// What is known about the host's paths from a class's config: the filesystem with this
/// device has its root at `host_prefix` on the host (derived from hostDir and where mountDir
/// lives). Lets the rules judge a volume by its host path when the agent runs in a container,
/// where the host's system directories are not visible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostAnchor {
    /// `major:minor` of the filesystem.
    pub device: String,
    /// Host path of that filesystem's root directory.
    pub host_prefix: PathBuf,
}

/// The anchor a class gives: its hostDir is the host path of its root's location, so when the
/// location's path is a suffix of hostDir the rest is where the filesystem's root sits on the
/// host (`/mnt/disks` at location `/mnt/disks` means the filesystem is the host's `/`).
pub(crate) fn host_anchor(host_dir: &Path, root: &Location) -> Option<HostAnchor> {
    let inside = root.path.strip_prefix("/").ok()?;
    if !host_dir.is_absolute() || !host_dir.ends_with(inside) {
        return None;
    }
    let depth = inside.components().count();
    let prefix = host_dir.ancestors().nth(depth)?;
    Some(HostAnchor { device: root.device.clone(), host_prefix: prefix.to_path_buf() })
}

/// Why a mounted directory volume must not be published: it is a kernel or container
/// filesystem, or its source contains the host root, a system directory or a discovery
/// directory, or lies inside a sensitive host directory. Judged by filesystem and path, so a
/// bind mount of `/` or of a parent of the discovery directory is caught whatever it is called.
pub(crate) fn exposure(
    volume: &MountFacts<'_>,
    places: &[ProtectedPlace],
    anchors: &[HostAnchor],
    host_dirs: &[PathBuf],
) -> Option<String> {
    if KERNEL_FS_TYPES.contains(&volume.fs_type) || NOT_A_DISK_FS_TYPES.contains(&volume.fs_type) {
        return Some(format!("its filesystem type {} is a kernel or container filesystem, not a disk", volume.fs_type));
    }
    for place in places.iter().filter(|p| p.location.device == volume.device) {
        if place.location.path.starts_with(volume.root) {
            return Some(format!(
                "its mount source ({} of device {}) contains {}",
                volume.root.display(),
                volume.device,
                place.what
            ));
        }
        if place.no_volume_inside && volume.root.starts_with(&place.location.path) {
            return Some(format!(
                "its mount source ({} of device {}) is inside {}",
                volume.root.display(),
                volume.device,
                place.what
            ));
        }
    }
    for anchor in anchors.iter().filter(|a| a.device == volume.device) {
        let host_path = join_inside(&anchor.host_prefix, volume.root.strip_prefix("/").unwrap_or(volume.root));
        if let Some(problem) = host_path_problem(&host_path, host_dirs) {
            return Some(format!("its mount source is the host directory {}, which {problem}", host_path.display()));
        }
    }
    None
}

/// Why a volume whose source is the host directory `host_path` would expose the host.
pub(crate) fn host_path_problem(host_path: &Path, host_dirs: &[PathBuf]) -> Option<String> {
    if let Some(dir) = SYSTEM_DIRS.iter().map(Path::new).find(|d| d.starts_with(host_path)) {
        return Some(format!("contains the system directory {}", dir.display()));
    }
    if let Some(dir) = host_dirs.iter().find(|d| d.starts_with(host_path)) {
        return Some(format!("contains the discovery directory {}", dir.display()));
    }
    SENSITIVE_DIRS
        .iter()
        .map(Path::new)
        .find(|d| host_path.starts_with(d))
        .map(|d| format!("is inside the host directory {}", d.display()))
}

/// Where a block device's data really is: a byte range of a base disk (the whole disk for a
/// partition, the backing file for a loop device). Two devices whose ranges of one base
/// overlap share data, whatever their device numbers.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Extent {
    /// The base: `dev:M:m` of a whole disk, or `file:D:I` (device and inode) of a backing file.
    pub base: String,
    /// First byte.
    pub start: u64,
    /// One past the last byte (`u64::MAX` when unknown).
    pub end: u64,
    /// For a file-backed base, where the file lives, so a loop device over a file inside a
    /// volume is known to share that volume's data.
    pub file: Option<Location>,
}

impl Extent {
    /// Whether the two hold some of the same bytes: one base, overlapping ranges.
    pub fn overlaps(&self, other: &Extent) -> bool {
        self.base == other.base && self.start < other.end && other.start < self.end
    }
}

/// What a volume occupies, to tell when two entries are one disk: a directory of a filesystem
/// (the whole filesystem when `root` is `/`) or a whole block device, each with the extent of
/// the block device underneath when there is one.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DiskKey {
    /// A mounted directory: filesystem device and the directory of it that is mounted.
    Filesystem { device: String, root: PathBuf, extent: Option<Extent> },
    /// A block device, by `major:minor`.
    Block { device: String, extent: Option<Extent> },
}

impl DiskKey {
    /// A mounted directory with no known block device underneath.
    pub fn fs(device: impl Into<String>, root: impl Into<PathBuf>) -> Self {
        DiskKey::Filesystem { device: device.into(), root: root.into(), extent: None }
    }

    /// A block device with no known extent.
    pub fn block(device: impl Into<String>) -> Self {
        DiskKey::Block { device: device.into(), extent: None }
    }

    /// The same key with the extent of the device underneath.
    pub fn with_extent(mut self, e: Option<Extent>) -> Self {
        match &mut self {
            DiskKey::Filesystem { extent, .. } | DiskKey::Block { extent, .. } => *extent = e,
        }
        self
    }

    /// `major:minor` of the device underneath.
    pub fn device(&self) -> &str {
        match self {
            DiskKey::Filesystem { device, .. } | DiskKey::Block { device, .. } => device,
        }
    }

    fn extent(&self) -> Option<&Extent> {
        match self {
            DiskKey::Filesystem { extent, .. } | DiskKey::Block { extent, .. } => extent.as_ref(),
        }
    }

    /// Tokens two overlapping keys always share (devices, extent bases, the filesystem a
    /// backing file lives on), so overlaps can be looked for among keys sharing one.
    pub fn tokens(&self) -> Vec<String> {
        let mut t = vec![format!("d:{}", self.device())];
        if let Some(e) = self.extent() {
            t.push(format!("e:{}", e.base));
            if let Some(f) = &e.file {
                t.push(format!("d:{}", f.device));
            }
        }
        t
    }

    /// Whether two volumes share data: the same device (for two directories, one inside the
    /// other: two different directories of one shared disk do not overlap), overlapping
    /// extents of one base disk or file, or a block device backed by a file inside the other
    /// (a directory volume).
    pub fn overlaps(&self, other: &DiskKey) -> bool {
        if self.device() == other.device() {
            return match (self, other) {
                (DiskKey::Filesystem { root: a, .. }, DiskKey::Filesystem { root: b, .. }) => {
                    a.starts_with(b) || b.starts_with(a)
                }
                _ => true,
            };
        }
        if let (Some(a), Some(b)) = (self.extent(), other.extent())
            && a.overlaps(b)
        {
            return true;
        }
        let backed_inside = |key: &DiskKey, dir: &DiskKey| match (key.extent().and_then(|e| e.file.as_ref()), dir) {
            (Some(file), DiskKey::Filesystem { device, root, .. }) => {
                file.device == *device && file.path.starts_with(root)
            }
            _ => false,
        };
        backed_inside(self, other) || backed_inside(other, self)
    }
}

/// Another PV of this node whose disk is known, for the wipe-time check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PublishedDisk {
    /// PV name.
    pub name: String,
    /// PV phase (`Bound`, `Available`, `Released`...).
    pub phase: String,
    /// Whether the PV is being deleted.
    pub deleting: bool,
    /// What its volume occupies now.
    pub disk: DiskKey,
}

/// Why wiping the disk `disk` of PV `name` would destroy what another PV still offers or
/// holds: another PV (published before these rules, or by upstream) names the same disk and
/// is not released, even while it is being deleted (it stays Bound until its claim goes).
/// Two released PVs of one disk may both be wiped.
pub(crate) fn wipe_would_hit_another_pv(name: &str, disk: &DiskKey, others: &[PublishedDisk]) -> Option<String> {
    others
        .iter()
        // A PV being deleted while Bound stays Bound (pv-protection) and its pod keeps using
        // the disk: only a released PV has no tenant left.
        .filter(|o| o.name != name && o.phase != "Released" && o.phase != "Failed")
        .find(|o| o.disk.overlaps(disk))
        .map(|o| {
            format!(
                "its disk is also published as PV {} ({}); wiping it would destroy that volume's data. Delete one of the two PVs after checking which one the disk belongs to",
                o.name,
                if o.phase.is_empty() { "no phase yet" } else { &o.phase }
            )
        })
}

/// The volume a wipe is about to erase, as the mount table and the device node name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WipeSubject<'a> {
    /// A mounted filesystem: its device (`major:minor`) and the directory of that filesystem the
    /// volume's mount shows (`/` unless the volume is a bind-mounted subdirectory).
    Filesystem { device: &'a str, root: &'a Path },
    /// A block device, by its `major:minor`.
    Device { rdev: &'a str },
}

/// The directories below kubelet's root (`--root-dir`) where kubelet mounts local volumes for
/// pods (kubelet's pkg/volume/local and volumepathhandler): a Filesystem PV is bind-mounted at
/// `pods/<uid>/volumes/kubernetes.io~local-volume/<pv>` (its subPaths at
/// `pods/<uid>/volume-subpaths/<pv>/...`); a Block PV's device node is bind-mounted at
/// `plugins/kubernetes.io~local-volume/volumeDevices/<pv>/<pod uid>` (the pod's own entry is a
/// symlink); a Filesystem PV whose path is a block device is formatted and mounted by kubelet
/// at `plugins/kubernetes.io/local-volume/mounts/<pv>` before that bind mount. The agent's
/// container mounts these three from the host, not kubelet's whole directory (its `pki/`, other
/// plugins' state); kubelet removes only the entries it makes inside them.
pub(crate) const KUBELET_LOCAL_VOLUME_DIRS: [&str; 3] =
    ["pods", "plugins/kubernetes.io~local-volume", "plugins/kubernetes.io/local-volume"];

/// Whether the mounts kubelet makes in one of [`KUBELET_LOCAL_VOLUME_DIRS`] show in this mount
/// namespace, from the mount that holds `nearest`: that directory, resolved, or (not made by
/// kubelet yet) its nearest existing parent inside kubelet's directory. Only a mount from the
/// host shows them: not the container's own root filesystem (`/`, an image that happens to
/// have the directory, or the parents the runtime made for narrower mounts), and not a mount
/// whose directory was removed on the host (the kernel shows its root as `...//deleted`): what
/// kubelet mounts in the directory made again would never reach it.
pub(crate) fn kubelet_mounts_visible(nearest: &Path, mounts: &[MountFacts<'_>]) -> bool {
    use std::os::unix::ffi::OsStrExt;
    containing_mount(mounts, nearest)
        .is_some_and(|m| m.mount_point != Path::new("/") && !m.root.as_os_str().as_bytes().ends_with(b"//deleted"))
}

/// One mount under kubelet's directory: what kubelet has mounted for pods. `node_rdev` is the
/// `major:minor` of the device node at the mount point when the mount is a bind-mounted device
/// node (how kubelet maps a Block volume for a pod).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KubeletMount<'a> {
    pub mount: MountFacts<'a>,
    pub node_rdev: Option<&'a str>,
}

/// Where kubelet still has `subject` mounted, if it has: a mount strictly below `kubelet_dir` of
/// the same filesystem with an overlapping root (the volume itself, a subPath inside it, or a
/// directory that contains it), a filesystem on the same device (a Filesystem PV kubelet
/// formatted on a raw device), or a bind-mounted node of the same device (a Block PV mapped into
/// a pod). Wiping then would erase a disk a container still writes to, and what it writes after
/// the wipe would reach the next tenant: the wipe waits until kubelet has unmounted it. A pod's
/// claim can be gone long before that (a force-deleted pod, a terminated one).
pub(crate) fn kubelet_mount_of<'a>(
    subject: WipeSubject<'_>,
    mounts: &[KubeletMount<'a>],
    kubelet_dir: &Path,
) -> Option<&'a Path> {
    mounts
        .iter()
        .filter(|k| k.mount.mount_point != kubelet_dir && k.mount.mount_point.starts_with(kubelet_dir))
        .find(|k| match subject {
            WipeSubject::Filesystem { device, root } => {
                k.mount.device == device && (k.mount.root.starts_with(root) || root.starts_with(k.mount.root))
            }
            WipeSubject::Device { rdev } => k.mount.device == rdev || k.node_rdev == Some(rdev),
        })
        .map(|k| k.mount.mount_point)
}

#[cfg(test)]
#[path = "volume_safety_tests.rs"]
mod tests;

//! Discovery: which first-level entries of each class's discovery directory are volumes this
//! node can publish, and why every other entry is not. Host scanning, so it lives in `host`:
//! it reads the host through the other `host` modules and decides with `core`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::config::{ClassConfig, ProvisionerConfig, VolumeMode};
use crate::core::config::pattern::NamePattern;
use crate::core::health::disk_health::Signs;
use crate::core::identity::disk_identity::{DiskIdentity, Kind};
use crate::core::identity::used_mark::UsedRead;
use crate::core::volumes::capacity::round_down_pretty;
use crate::core::volumes::pv::{FoundVolume, clean_path, host_path};
use crate::core::volumes::volume_safety::{
    DiskKey, HostAnchor, MountFacts, ProtectedPlace, RootFacts, SENSITIVE_DIRS, SYSTEM_DIRS, containing_mount,
    dedicated_dev_dir, exposure, host_anchor, host_area_places, locate, root_problem, root_source_problem,
    shared_roots,
};
use crate::host::HostError;
use crate::host::devices::blockdev::{Extents, block_device_in_use, block_device_number, extent};
use crate::host::health::disk_health::read_signs;
use crate::host::identity::fingerprint::volume_identity_in;
use crate::host::identity::used_mark::{Ledger, open_volume_root, read_dir_mark};
use crate::host::mounts::mountinfo::MountTable;
use crate::host::ops::{Answer, Job, OnDeadline, Operations, Subject, foreground};
use crate::host::volumes::volume::{
    EntryKind, block_device_capacity, mount_at, mount_of_fd, mounted_dir_capacity, resolve_entry,
};

/// Why an entry was not turned into a volume; shown by `discover` and logged by the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    /// The whole discovery directory could not be read.
    UnreadableDirectory(String),
    /// The discovery directory resolves to `/`, a system directory or a pseudo-filesystem.
    UnsafeRoot(String),
    /// Another class's discovery directory is the same directory, or they nest.
    SharedRoot(String),
    /// The class's namePattern could not be parsed (validation normally prevents this).
    BadPattern(String),
    /// The name does not match namePattern.
    PatternMismatch(String),
    /// The name is not UTF-8 and cannot be a PV path.
    NotUtf8,
    /// A directory that is not a mount point: its space is the parent filesystem's.
    NotMountPoint,
    /// A directory in a Block class.
    DirectoryInBlockClass,
    /// A symlink to something other than a block device (what it points at is given): never
    /// followed, since it could lead out of the discovery directory.
    Symlink(String),
    /// The mount's source is the host itself (its root, a system or discovery directory) or a
    /// kernel filesystem.
    ExposesHost(String),
    /// Neither a directory nor a block device.
    NotDirectoryOrBlockDevice,
    /// stat/statfs/ioctl failed (dangling symlink, permissions...).
    Unreadable(String),
    /// A device the agent claimed, with no PV now, shows something the agent did not put
    /// there, or cannot be proven blank (in use, unreadable; see core::devices::device_claim): kept from
    /// tenants until an operator clears it.
    DeviceHeld(String),
    /// The volume did not answer within its deadline (host::ops): nothing is published for it
    /// until it answers again.
    Unresponsive(String),
    /// The disk shows signs of failing (core::health::disk_health): not offered to a tenant.
    DiskFailing(String),
}

impl SkipReason {
    /// A short stable name, for metric labels and scripts.
    pub fn code(&self) -> &'static str {
        match self {
            SkipReason::UnreadableDirectory(_) => "unreadable-directory",
            SkipReason::UnsafeRoot(_) => "unsafe-root",
            SkipReason::SharedRoot(_) => "shared-root",
            SkipReason::BadPattern(_) => "bad-pattern",
            SkipReason::PatternMismatch(_) => "pattern-mismatch",
            SkipReason::NotUtf8 => "not-utf8",
            SkipReason::NotMountPoint => "not-mount-point",
            SkipReason::DirectoryInBlockClass => "directory-in-block-class",
            SkipReason::Symlink(_) => "symlink",
            SkipReason::ExposesHost(_) => "exposes-host",
            SkipReason::NotDirectoryOrBlockDevice => "not-directory-or-block-device",
            SkipReason::Unreadable(_) => "unreadable",
            SkipReason::DeviceHeld(_) => "device-held",
            SkipReason::Unresponsive(_) => "unresponsive",
            SkipReason::DiskFailing(_) => "disk-failing",
        }
    }

    /// Whether the skip is about a whole class's discovery directory, not one entry.
    pub fn is_class_wide(&self) -> bool {
        matches!(
            self,
            SkipReason::UnreadableDirectory(_)
                | SkipReason::UnsafeRoot(_)
                | SkipReason::SharedRoot(_)
                | SkipReason::BadPattern(_)
        )
    }

    /// Whether the skip protects data from a dangerous set-up, so the operator is warned
    /// (a Warning event) rather than only told in a log line.
    pub fn is_safety_refusal(&self) -> bool {
        matches!(
            self,
            SkipReason::UnsafeRoot(_)
                | SkipReason::SharedRoot(_)
                | SkipReason::Symlink(_)
                | SkipReason::ExposesHost(_)
                | SkipReason::DeviceHeld(_)
                | SkipReason::DiskFailing(_)
                | SkipReason::Unresponsive(_)
        )
    }

    /// Whether the agent tells the skip in a Warning event (once per occurrence): the safety
    /// refusals, and the set-ups an operator must fix (an unreadable discovery directory, a bad
    /// namePattern, an entry of a kind that is never a volume). A held device is told by its
    /// claim report (`DeviceHeld`) instead; ordinary skips (not a mount point, not matching
    /// namePattern, unreadable) only in a log line.
    pub fn is_evented(&self) -> bool {
        let refused = matches!(
            self,
            SkipReason::UnreadableDirectory(_)
                | SkipReason::BadPattern(_)
                | SkipReason::NotUtf8
                | SkipReason::DirectoryInBlockClass
                | SkipReason::NotDirectoryOrBlockDevice
        );
        refused || (self.is_safety_refusal() && !matches!(self, SkipReason::DeviceHeld(_)))
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::UnreadableDirectory(e) => write!(f, "discovery directory unreadable: {e}"),
            SkipReason::UnsafeRoot(e) => write!(f, "discovery directory not scanned: it {e}"),
            SkipReason::SharedRoot(e) => write!(f, "discovery directory not scanned: {e}"),
            SkipReason::BadPattern(e) => write!(f, "bad namePattern: {e}"),
            SkipReason::PatternMismatch(p) => write!(f, "name does not match namePattern {p:?}"),
            SkipReason::NotUtf8 => write!(f, "name is not valid UTF-8"),
            SkipReason::NotMountPoint => {
                write!(f, "directory is not a mount point (mount a filesystem there, or bind-mount it onto itself)")
            }
            SkipReason::DirectoryInBlockClass => {
                write!(f, "directory in a Block class (only block devices can be Block volumes)")
            }
            SkipReason::Symlink(target) => write!(
                f,
                "symlink to {target}; symlinks are followed only to block devices (mount a directory volume at the entry itself)"
            ),
            SkipReason::ExposesHost(e) => write!(f, "not published: {e}"),
            SkipReason::NotDirectoryOrBlockDevice => write!(f, "neither a directory nor a block device"),
            SkipReason::Unreadable(e) => write!(f, "{e}"),
            SkipReason::DiskFailing(what) => write!(
                f,
                "its disk is failing ({what}); published once the signs clear (see docs/troubleshooting.md#a-pv-or-pvc-shows-diskfailing)"
            ),
            SkipReason::Unresponsive(what) => write!(
                f,
                "{what}; the volume is published once it answers again (see docs/troubleshooting.md#a-volume-is-not-published-and-the-skip-says-unresponsive)"
            ),
            SkipReason::DeviceHeld(what) => write!(
                f,
                "the device this agent claimed has no PV and is not offered again: {what} (not put there by this agent, or a doubt it cannot settle); clear it (blkdiscard -z) or remove the link"
            ),
        }
    }
}

/// One entry that was not published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// StorageClass name.
    pub class: String,
    /// Path as seen by the agent (under mountDir).
    pub path: PathBuf,
    /// Why.
    pub reason: SkipReason,
}

/// The result of scanning every class.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    /// Volumes found, in class then entry order.
    pub volumes: Vec<FoundVolume>,
    /// Entries not published, with reasons.
    pub skipped: Vec<Skipped>,
    /// What the kernel shows of each examined entry's disk (host path, signs): read by the
    /// agent only (core::health::disk_health judges them).
    pub signs: Vec<(String, Signs)>,
    /// The discovery directories as they resolved (the mount table names real paths): the
    /// agent's mount watch follows mounts there (core::mounts::mount_interest).
    pub roots: Vec<PathBuf>,
}

/// How the agent examines entries: each on the pool of per-volume operations, with a deadline
/// (host::ops), and with the used mark read in the same operation, against the ledger.
#[derive(Clone)]
pub(crate) struct Examine {
    /// The executor.
    pub ops: Operations,
    /// Each entry's deadline.
    pub timeout: Duration,
    /// The ledger the used marks are classified against.
    pub ledger: Option<Ledger>,
    /// Every block device's extent, read under their deadlines once per scan, by the first
    /// Block class with an entry not published yet (its in-use check compares with them).
    pub extents: std::sync::OnceLock<Arc<Extents>>,
}

/// Scans all classes against a given mount table (one read of the table per pass; roots are
/// resolved and checked first, on every pass, since a symlink or a mount can change them),
/// with links that are not there yet seen as if they were: (class, name, target). The
/// `discover` dry run shows what the agent's device claims would publish without making them.
pub(crate) fn scan_with_links(
    config: &ProvisionerConfig,
    mounts: &MountTable,
    published: &BTreeSet<String>,
    links: &[(String, String, PathBuf)],
) -> Scan {
    scan_examined(config, Arc::new(mounts.clone()), published, links, None)
}

/// [`scan_with_links`] as the agent runs it: every entry examined under its own deadline when
/// `examine` is given (an unresponsive one is skipped, the others go on), with its used mark.
pub(crate) fn scan_examined(
    config: &ProvisionerConfig,
    mounts: Arc<MountTable>,
    published: &BTreeSet<String>,
    links: &[(String, String, PathBuf)],
    examine: Option<&Examine>,
) -> Scan {
    let mut out = Scan::default();
    let facts = mounts.facts();
    let (roots, problems) = check_roots(config, &facts);
    out.roots = roots.iter().map(|r| r.resolved.clone()).collect();
    let host_dirs: Vec<PathBuf> =
        config.storage_class_map.values().map(|c| PathBuf::from(clean_path(&c.host_dir))).collect();
    let guard = Arc::new(GuardFacts {
        places: protected_places(&roots, &facts),
        anchors: anchors(config, &roots),
        host_dirs,
        published: published.clone(),
        mounts: mounts.clone(),
    });
    for (class, cfg) in &config.storage_class_map {
        match (roots.iter().find(|r| r.class == *class), problems.get(class)) {
            (Some(root), None) => {
                let extra: BTreeMap<&str, &Path> =
                    links.iter().filter(|l| l.0 == *class).map(|l| (l.1.as_str(), l.2.as_path())).collect();
                scan_class(class, cfg, &root.resolved, &extra, &guard, examine, &mut out)
            }
            (_, Some(reason)) => out.skipped.push(Skipped {
                class: class.clone(),
                path: PathBuf::from(&cfg.mount_dir),
                reason: reason.clone(),
            }),
            (None, None) => {}
        }
    }
    out
}

/// Checks every class's discovery root as it resolves now. Returns the usable roots and, per
/// class, why its root is not scanned.
pub(crate) fn check_roots(
    config: &ProvisionerConfig,
    facts: &[MountFacts<'_>],
) -> (Vec<RootFacts>, BTreeMap<String, SkipReason>) {
    let host_places = &host_places(facts);
    let mut roots = Vec::new();
    let mut problems = BTreeMap::new();
    for (class, cfg) in &config.storage_class_map {
        let dir = Path::new(&cfg.mount_dir);
        let resolved = match std::fs::canonicalize(dir) {
            Ok(p) => p,
            Err(e) => {
                problems.insert(class.clone(), SkipReason::UnreadableDirectory(format!("{}: {e}", dir.display())));
                continue;
            }
        };
        if let Some(p) = root_problem(&resolved) {
            problems.insert(class.clone(), SkipReason::UnsafeRoot(p));
            continue;
        }
        let dedicated = dedicated_dev_dir(&resolved).then_some(resolved.as_path());
        let source_problem = containing_mount(facts, &resolved).and_then(|m| {
            let location = locate(facts, &resolved)?;
            root_source_problem(m, &location, Path::new(&clean_path(&cfg.host_dir)), host_places, dedicated)
        });
        if let Some(p) = source_problem {
            problems.insert(
                class.clone(),
                SkipReason::UnsafeRoot(format!("resolves to {}, which {p}", resolved.display())),
            );
            continue;
        }
        match std::fs::metadata(&resolved) {
            Ok(meta) if meta.is_dir() => roots.push(RootFacts {
                class: class.clone(),
                location: locate(facts, &resolved),
                resolved,
                dev_ino: (meta.dev(), meta.ino()),
            }),
            Ok(_) => {
                problems.insert(
                    class.clone(),
                    SkipReason::UnreadableDirectory(format!("{} is not a directory", dir.display())),
                );
            }
            Err(e) => {
                problems.insert(class.clone(), SkipReason::UnreadableDirectory(format!("{}: {e}", dir.display())));
            }
        }
    }
    for (class, p) in shared_roots(&roots) {
        problems.insert(class, SkipReason::SharedRoot(p));
    }
    roots.retain(|r| !problems.contains_key(&r.class));
    (roots, problems)
}

/// The facts every entry is checked against, owned so an entry can be examined on another
/// thread (host::ops).
struct GuardFacts {
    mounts: Arc<MountTable>,
    places: Vec<ProtectedPlace>,
    published: BTreeSet<String>,
    anchors: Vec<HostAnchor>,
    host_dirs: Vec<PathBuf>,
}

/// [`GuardFacts`] with the mount table's facts, as one entry's inspection reads them.
struct Guard<'a> {
    facts: &'a [MountFacts<'a>],
    extents: Option<&'a Extents>,
    places: &'a [ProtectedPlace],
    anchors: &'a [HostAnchor],
    host_dirs: &'a [PathBuf],
}

/// The host root, the system directories and every discovery root, located in the mount
/// table: no volume may contain one (nor lie inside a sensitive one).
fn protected_places(roots: &[RootFacts], facts: &[MountFacts<'_>]) -> Vec<ProtectedPlace> {
    let mut places = host_places(facts);
    for root in roots {
        if let Some(location) = root.location.clone() {
            let what = format!("the discovery directory {} of class {}", root.resolved.display(), root.class);
            places.push(ProtectedPlace { what, location, no_volume_inside: false });
        }
    }
    places
}

/// The host root, the system directories and the host's own mounts, located in the mount table.
pub(crate) fn host_places(facts: &[MountFacts<'_>]) -> Vec<ProtectedPlace> {
    let mut places = Vec::new();
    for dir in SYSTEM_DIRS {
        let Ok(resolved) = std::fs::canonicalize(dir) else { continue };
        if let Some(location) = locate(facts, &resolved) {
            let no_volume_inside = SENSITIVE_DIRS.contains(&dir);
            places.push(ProtectedPlace { what: format!("the system directory {dir}"), location, no_volume_inside });
        }
    }
    places.extend(host_area_places(facts));
    places
}

fn anchors(config: &ProvisionerConfig, roots: &[RootFacts]) -> Vec<HostAnchor> {
    roots
        .iter()
        .filter_map(|r| {
            let cfg = config.storage_class_map.get(&r.class)?;
            host_anchor(Path::new(&clean_path(&cfg.host_dir)), r.location.as_ref()?)
        })
        .collect()
}

fn scan_class(
    class: &str,
    cfg: &ClassConfig,
    root: &Path,
    extra: &BTreeMap<&str, &Path>,
    guard: &Arc<GuardFacts>,
    examine: Option<&Examine>,
    out: &mut Scan,
) {
    let mount_dir = Path::new(&cfg.mount_dir);
    let mut skip = |path: PathBuf, reason| out.skipped.push(Skipped { class: class.to_string(), path, reason });
    let pattern = match NamePattern::parse(&cfg.name_pattern) {
        Ok(p) => p,
        Err(e) => return skip(mount_dir.to_path_buf(), SkipReason::BadPattern(e)),
    };
    let mut names: Vec<_> = match std::fs::read_dir(root) {
        Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.file_name())).collect(),
        Err(e) => return skip(mount_dir.to_path_buf(), SkipReason::UnreadableDirectory(e.to_string())),
    };
    for name in extra.keys() {
        let name = std::ffi::OsString::from(name);
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names.sort();
    // (path under mountDir, entry name, what to examine)
    let mut entries = Vec::new();
    for name in names {
        let path = mount_dir.join(&name);
        let Some(name) = name.to_str() else {
            skip(path, SkipReason::NotUtf8);
            continue;
        };
        if !pattern.matches(name) {
            skip(path, SkipReason::PatternMismatch(cfg.name_pattern.clone()));
            continue;
        }
        let entry = extra.get(name).map_or_else(|| root.join(name), |target| target.to_path_buf());
        entries.push((path, name.to_string(), entry));
    }
    let unpublished = |name: &str| !guard.published.contains(&host_path(&cfg.host_dir, name));
    if let (Some(ex), VolumeMode::Block) = (examine, cfg.volume_mode)
        && entries.iter().any(|(_, name, _)| unpublished(name))
    {
        ex.extents
            .get_or_init(|| Arc::new(crate::host::devices::blockdev::extents(&guard.mounts, &ex.ops, ex.timeout)));
    }
    let extents = examine.and_then(|ex| ex.extents.get().cloned());
    let entry_of = |name: &str, entry: PathBuf| EntryJob {
        extents: extents.clone(),
        class: class.to_string(),
        entry,
        name: name.to_string(),
        host_path: host_path(&cfg.host_dir, name),
        mode: cfg.volume_mode,
        mount_dir: PathBuf::from(&cfg.mount_dir),
    };
    // What an entry's inspection runs on, for the executor: its subject and its filesystem.
    let inspected_as =
        |name: &str, entry: &Path| (Subject::Volume(host_path(&cfg.host_dir, name)), guard.mounts.domain_of(entry));
    // None: still being examined (host::ops's grace passed): neither published nor skipped
    // this pass; its answer is kept for the next one.
    let results: Vec<Option<Examined>> = match examine {
        // The `discover` dry run, an operator's command in a terminal: no deadline.
        None => entries
            .iter()
            .map(|(_, name, entry)| Some(foreground(|on| entry_of(name, entry.clone()).run(guard, None, on))))
            .collect(),
        Some(ex) => {
            let jobs = entries.iter().map(|(_, name, entry)| {
                let job = entry_of(name, entry.clone());
                let (subject, domain) = inspected_as(name, entry);
                let (guard, ledger) = (guard.clone(), ex.ledger.clone());
                Job::new(subject, "inspection", ex.timeout, move |on| job.run(&guard, ledger.as_ref(), on)).on(domain)
            });
            ex.ops
                .run_each(jobs)
                .into_iter()
                .map(|r| match r {
                    Answer::Done(v) => Some(v),
                    Answer::Pending => None,
                    Answer::Unresponsive(e) => Some((Err(SkipReason::Unresponsive(e.to_string())), None)),
                })
                .collect()
        }
    };
    for ((path, name, entry), examined) in entries.into_iter().zip(results) {
        let Some((result, signs)) = examined else {
            if let Some(ex) = examine
                && tracing::enabled!(tracing::Level::DEBUG)
            {
                let (subject, domain) = inspected_as(&name, &entry);
                tracing::debug!(path = %path.display(), state = %ex.ops.explain(&subject, domain.as_ref()), "entry still being examined");
            }
            continue;
        };
        if let Some(signs) = signs {
            out.signs.push((host_path(&cfg.host_dir, &name), signs));
        }
        match result {
            Ok(v) => out.volumes.push(v),
            Err(reason) => out.skipped.push(Skipped { class: class.to_string(), path, reason }),
        }
    }
}

/// One entry to examine, owned so it can run on another thread.
struct EntryJob {
    /// Every block device's extent as read this pass, when its class needed them (see
    /// scan_class); else its in-use check reads them.
    extents: Option<Arc<Extents>>,
    class: String,
    /// The entry (the discovery root joined with its name, or a claim link's target).
    entry: PathBuf,
    name: String,
    host_path: String,
    mode: VolumeMode,
    mount_dir: PathBuf,
}

/// What examining one entry found: the volume or why not, and (for the agent) its disk's signs.
type Examined = (Result<FoundVolume, SkipReason>, Option<Signs>);

impl EntryJob {
    /// Examines the entry: with a ledger (the agent), reads its used mark and its disk's
    /// failing signs too, with every I/O error met on the way as the sign `io-failure`.
    fn run(self, facts: &GuardFacts, ledger: Option<&Ledger>, on: &OnDeadline) -> Examined {
        let entry = self.entry.clone();
        let (found, bytes, io_failure) = self.found(facts, ledger, on);
        let signs = ledger.map(|_| {
            // The volume's mount, or the block device it is.
            let mount = facts.mounts.get(&entry);
            let device = match mount {
                Some(m) => m.device.clone(),
                None => block_device_number(&entry).unwrap_or_default(),
            };
            let mut signs = read_signs(&entry, mount, &device, bytes, on);
            if let Some(what) = io_failure {
                signs.io_failure.get_or_insert(what);
            }
            signs
        });
        (found, signs)
    }

    /// Inspects the entry and reads its identity; with a ledger, its used mark too. Also
    /// returns the size read (unrounded) and the I/O error met, if any: an entry whose disk
    /// fails a read is skipped as `disk-failing`, and one whose used mark cannot be read for
    /// an I/O error keeps the mark unknown (never published) with the failure told.
    fn found(
        self,
        facts: &GuardFacts,
        ledger: Option<&Ledger>,
        on: &OnDeadline,
    ) -> (Result<FoundVolume, SkipReason>, Option<u64>, Option<String>) {
        let mount_facts = facts.mounts.facts();
        let guard = Guard {
            facts: &mount_facts,
            extents: self.extents.as_deref(),
            places: &facts.places,
            anchors: &facts.anchors,
            host_dirs: &facts.host_dirs,
        };
        let mounts = facts.mounts.as_ref();
        let probe = !facts.published.contains(&self.host_path);
        let failed = |reason: SkipReason| {
            let io = match &reason {
                SkipReason::DiskFailing(what) => Some(what.strip_prefix("io-failure: ").unwrap_or(what).to_string()),
                _ => None,
            };
            (Err(reason), None, io)
        };
        let v = match inspect(&self.entry, self.mode, mounts, &guard, probe, on) {
            Ok(v) => v,
            Err(reason) => return failed(reason),
        };
        let identity = match volume_identity_in(&self.entry, mounts) {
            Ok(identity) => identity,
            Err(e) => return failed(skip_for(e)),
        };
        let bytes = v.bytes;
        let mut found = FoundVolume {
            class: self.class,
            entry: self.name,
            host_path: self.host_path,
            capacity_bytes: round_down_pretty(v.bytes),
            identity,
            disk: v.disk,
            in_use: v.in_use,
            used: Default::default(),
        };
        let mut io_failure = None;
        if let Some(ledger) = ledger {
            let (used, io) = used_mark_read(&found, &self.mount_dir, mounts, Some(ledger));
            found.used = used;
            io_failure = io;
        }
        (Ok(found), Some(bytes), io_failure)
    }
}

/// An inspection error as a skip: an I/O error of the disk (EIO...: host::health::disk_health) is the
/// failing sign `io-failure`, so the entry is skipped as `disk-failing`; any other error
/// (gone, not allowed) leaves it unreadable.
fn skip_for(e: HostError) -> SkipReason {
    if e.is_disk_failure() {
        SkipReason::DiskFailing(format!("io-failure: {e}"))
    } else {
        SkipReason::Unreadable(e.to_string())
    }
}

/// Takes the claim links that must not be published (core::devices::device_claim's `held`) out of
/// the volumes found, into the skipped entries with the reason. Call after the used marks are
/// read: a device the ledger knows as a tenant's disk of ours is not held but left to the
/// wipe-first path, which wipes it (its identity proven) before it is published again.
pub(crate) fn hold_back(scan: &mut Scan, config: &ProvisionerConfig, held: &[(String, String, String)]) {
    // Only a disk a claim used (a tenant's) goes to the wipe-first path; one never bound
    // that someone wrote to since is held like any other.
    hold_back_where(scan, config, held, |v| !matches!(&v.used, UsedRead::Marked(m) if m.claimed));
}

/// Takes the links in `held` out of the volumes found whatever their used mark says: devices
/// that changed under their unbound PV (core::devices::device_claim's `tampered`), which are neither
/// offered nor wiped until an operator clears them.
pub(crate) fn hold_back_always(scan: &mut Scan, config: &ProvisionerConfig, held: &[(String, String, String)]) {
    hold_back_where(scan, config, held, |_| true);
}

fn hold_back_where(
    scan: &mut Scan,
    config: &ProvisionerConfig,
    held: &[(String, String, String)],
    applies: impl Fn(&FoundVolume) -> bool,
) {
    let is_held =
        |v: &FoundVolume| applies(v) && held.iter().any(|(class, name, _)| *class == v.class && *name == v.entry);
    let (held_now, kept): (Vec<FoundVolume>, Vec<FoundVolume>) =
        std::mem::take(&mut scan.volumes).into_iter().partition(is_held);
    scan.volumes = kept;
    for v in held_now {
        let what =
            held.iter().find(|(c, n, _)| *c == v.class && *n == v.entry).map(|h| h.2.clone()).unwrap_or_default();
        let dir = config.storage_class_map.get(&v.class).map(|c| c.mount_dir.clone()).unwrap_or_default();
        scan.skipped.push(Skipped {
            class: v.class.clone(),
            path: Path::new(&dir).join(&v.entry),
            reason: SkipReason::DeviceHeld(what),
        });
    }
}

/// Fills in each volume's used mark (see core::identity::used_mark): the attribute on a filesystem
/// volume's root, opened without following links, else the ledger, which relates the volume
/// to every used disk it may share data with (the same device, a directory of a used
/// filesystem). Without a ledger (the `discover` dry run) only the attribute is read.
pub(crate) fn read_used_marks(
    volumes: &mut [FoundVolume],
    config: &ProvisionerConfig,
    mounts: &MountTable,
    ledger: Option<&Ledger>,
) {
    for v in volumes {
        v.used = match config.storage_class_map.get(&v.class) {
            Some(class) => used_mark_of(v, Path::new(&class.mount_dir), mounts, ledger),
            None => UsedRead::Unknown(format!("class {} is not in the config", v.class)),
        };
    }
}

/// The used mark of one volume found under `mount_dir` (see [`read_used_marks`]).
fn used_mark_of(v: &FoundVolume, mount_dir: &Path, mounts: &MountTable, ledger: Option<&Ledger>) -> UsedRead {
    used_mark_read(v, mount_dir, mounts, ledger).0
}

/// [`used_mark_of`], with the I/O error that made it unknown, if one did (the sign
/// `io-failure`: a bad sector where the root's attributes live fails every read of the mark).
fn used_mark_read(
    v: &FoundVolume,
    mount_dir: &Path,
    mounts: &MountTable,
    ledger: Option<&Ledger>,
) -> (UsedRead, Option<String>) {
    let is_block = DiskIdentity::parse(&v.identity).is_some_and(|d| d.kind == Kind::Block);
    if is_block {
        return (ledger.map_or(UsedRead::Unmarked, |l| l.lookup(&v.identity, None)), None);
    }
    let path = mount_dir.join(&v.entry);
    let root = match open_volume_root(&path) {
        Ok(root) => root,
        Err(e) => {
            let io = e.is_disk_failure().then(|| e.to_string());
            return (UsedRead::Unknown(e.to_string()), io);
        }
    };
    let dir = mount_of_fd(root.as_fd(), mounts).map(|m| m.root.display().to_string());
    match read_dir_mark(root.as_fd(), &path) {
        Ok(Some(mark)) => (ledger.map_or(UsedRead::Marked(mark.clone()), |l| l.classify(mark)), None),
        Ok(None) => (ledger.map_or(UsedRead::Unmarked, |l| l.lookup(&v.identity, dir.as_deref())), None),
        Err(e) => {
            let io = e.disk_failed.then(|| e.why.clone());
            (UsedRead::Unknown(e.why), io)
        }
    }
}

/// What inspecting one entry found.
struct Inspected {
    bytes: u64,
    disk: DiskKey,
    in_use: Option<String>,
}

/// Decides whether one entry (`entry` = resolved root joined with the entry's own name) is a
/// volume of the class's mode, and reads its raw capacity and what disk it occupies.
fn inspect(
    entry: &Path,
    mode: VolumeMode,
    mounts: &MountTable,
    guard: &Guard<'_>,
    probe_use: bool,
    on: &OnDeadline,
) -> Result<Inspected, SkipReason> {
    let unreadable = skip_for;
    let (kind, entry) = resolve_entry(entry).map_err(unreadable)?;
    match (kind, mode) {
        (EntryKind::Directory, VolumeMode::Block) => Err(SkipReason::DirectoryInBlockClass),
        (EntryKind::Directory, VolumeMode::Filesystem) => {
            // The entry itself must be the root of the mount visible there, at its unresolved
            // name (by the kernel's mount ID: covered and stacked mounts are not it).
            let mount = mount_at(&entry, mounts).map_err(unreadable)?.ok_or(SkipReason::NotMountPoint)?;
            if let Some(problem) = exposure(&mount.facts(), guard.places, guard.anchors, guard.host_dirs) {
                return Err(SkipReason::ExposesHost(problem));
            }
            // A mount inside the volume is judged the same way: a pod whose volume is bound in
            // recursively would see it.
            for nested in mounts.mounts_below(&entry) {
                if let Some(problem) = exposure(&nested.facts(), guard.places, guard.anchors, guard.host_dirs) {
                    let at = nested.mount_point.display();
                    return Err(SkipReason::ExposesHost(format!("the mount inside it at {at}: {problem}")));
                }
            }
            let bytes = mounted_dir_capacity(&entry).map_err(unreadable)?;
            let disk = filesystem_disk(mount, guard.facts, on);
            Ok(Inspected { bytes, disk, in_use: None })
        }
        // A block device in a Filesystem class is a Filesystem PV that kubelet formats.
        (EntryKind::BlockDevice, _) => {
            let bytes = block_device_capacity(&entry).map_err(unreadable)?;
            let device = block_device_number(&entry).map_err(unreadable)?;
            let in_use = if probe_use {
                block_device_in_use(&entry, mounts, guard.facts, guard.extents, on).map_err(unreadable)?
            } else {
                None
            };
            let disk = block_disk(device, guard.facts, on);
            Ok(Inspected { bytes, disk, in_use })
        }
        (EntryKind::Symlink, _) => Err(SkipReason::Symlink(describe_link(&entry))),
        (EntryKind::Other, _) => Err(SkipReason::NotDirectoryOrBlockDevice),
    }
}

/// What the volume at `path` (an entry under a class's mountDir) occupies now, judged like
/// discovery judges it: a mount point at the entry itself, or a block device. `None` when
/// there is no volume there.
pub(crate) fn disk_at(path: &Path, mounts: &MountTable, facts: &[MountFacts<'_>], on: &OnDeadline) -> Option<DiskKey> {
    match resolve_entry(path).ok()? {
        (EntryKind::Directory, entry) => Some(filesystem_disk(mount_at(&entry, mounts).ok()??, facts, on)),
        (EntryKind::BlockDevice, entry) => Some(block_disk(block_device_number(&entry).ok()?, facts, on)),
        _ => None,
    }
}

/// What a mounted directory volume occupies: its filesystem and mounted directory, with the
/// extent of the block device under it.
fn filesystem_disk(
    mount: &crate::host::mounts::mountinfo::MountEntry,
    facts: &[MountFacts<'_>],
    on: &OnDeadline,
) -> DiskKey {
    DiskKey::fs(mount.device.clone(), mount.root.clone()).with_extent(extent(&mount.device, facts, on))
}

/// What a block device volume occupies: the device, with its extent on its base disk or file.
fn block_disk(device: String, facts: &[MountFacts<'_>], on: &OnDeadline) -> DiskKey {
    let e = extent(&device, facts, on);
    DiskKey::block(device).with_extent(e)
}

/// What a symlink that is not followed points at, for its skip reason.
fn describe_link(link: &Path) -> String {
    let target = std::fs::read_link(link).map(|t| t.display().to_string()).unwrap_or_else(|_| "?".into());
    match std::fs::metadata(link) {
        Ok(m) if m.is_dir() => format!("the directory {target}"),
        Ok(_) => format!("{target}, which is not a block device"),
        Err(e) => format!("{target}, which cannot be reached ({e})"),
    }
}

/// Why the mount a wipe is about to walk must not be wiped, judged as discovery judges a new
/// volume: its source contains the host root, a system directory or the class's discovery
/// directory, or lies in a sensitive host directory, or it is a kernel filesystem. Checked
/// before every filesystem wipe, so a PV that recorded no identity (made by upstream) cannot
/// be turned into a wipe of the host by a bind mount at its path.
pub(crate) fn wipe_exposure(
    mount: &crate::host::mounts::mountinfo::MountEntry,
    mounts: &MountTable,
    class: &ClassConfig,
) -> Option<String> {
    let facts = mounts.facts();
    let mut places = host_places(&facts);
    let host_dir = PathBuf::from(clean_path(&class.host_dir));
    let root = std::fs::canonicalize(&class.mount_dir).ok().and_then(|r| locate(&facts, &r));
    if let Some(location) = root.clone() {
        let what = format!("the discovery directory {}", class.mount_dir);
        places.push(ProtectedPlace { what, location, no_volume_inside: false });
    }
    let anchors: Vec<HostAnchor> = root.and_then(|l| host_anchor(&host_dir, &l)).into_iter().collect();
    exposure(&mount.facts(), &places, &anchors, std::slice::from_ref(&host_dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::identity::used_mark::UsedMark;

    fn found(class: &str, entry: &str, used: UsedRead) -> FoundVolume {
        FoundVolume {
            class: class.into(),
            entry: entry.into(),
            host_path: format!("/mnt/{class}/{entry}"),
            capacity_bytes: 1 << 30,
            identity: "v2;blk;disk=wwid:x;size=1;dev=8:0".into(),
            disk: DiskKey::block("8:0"),
            in_use: None,
            used,
        }
    }

    #[test]
    fn refusals_are_evented_and_ordinary_skips_and_held_devices_are_not() {
        let s = || String::from("x");
        let table = [
            (SkipReason::UnreadableDirectory(s()), true),
            (SkipReason::UnsafeRoot(s()), true),
            (SkipReason::SharedRoot(s()), true),
            (SkipReason::BadPattern(s()), true),
            (SkipReason::PatternMismatch(s()), false),
            (SkipReason::NotUtf8, true),
            (SkipReason::NotMountPoint, false),
            (SkipReason::DirectoryInBlockClass, true),
            (SkipReason::Symlink(s()), true),
            (SkipReason::ExposesHost(s()), true),
            (SkipReason::NotDirectoryOrBlockDevice, true),
            (SkipReason::Unreadable(s()), false),
            // Told by its DeviceHeld event, once.
            (SkipReason::DeviceHeld(s()), false),
            (SkipReason::Unresponsive(s()), true),
            (SkipReason::DiskFailing(s()), true),
        ];
        for (reason, evented) in table {
            assert_eq!(reason.is_evented(), evented, "{}", reason.code());
        }
    }

    #[test]
    fn held_links_are_kept_from_publishing_unless_the_ledger_knows_the_disk_as_ours() {
        let mut config = ProvisionerConfig::default();
        let class: ClassConfig = crate::config::parse_entries(
            "t",
            &[("storageClassMap".into(), "fast:\n  hostDir: /mnt/fast\n  mountDir: /mnt/fast\n".into())],
        )
        .unwrap()
        .config
        .storage_class_map["fast"]
            .clone();
        config.storage_class_map.insert("fast".into(), class);
        let mark = UsedMark {
            pv: "local-pv-1".into(),
            node: "n".into(),
            path: "/mnt/fast/b".into(),
            identity: "v2;blk;disk=wwid:x".into(),
            at: "now".into(),
            uid: None,
            root: None,
            claimed: true,
            wiped_filesystems: Default::default(),
        };
        let mut scan = Scan {
            volumes: vec![
                found("fast", "a", UsedRead::Unmarked),
                found("fast", "b", UsedRead::Marked(mark.clone())),
                found("fast", "c", UsedRead::Unmarked),
                found("fast", "d", UsedRead::Marked(UsedMark { claimed: false, ..mark })),
                found("other", "a", UsedRead::Unmarked),
            ],
            ..Default::default()
        };
        let held = vec![
            ("fast".to_string(), "a".to_string(), "ext4 superblock at 1080".to_string()),
            ("fast".to_string(), "b".to_string(), "xfs superblock at 0".to_string()),
            ("fast".to_string(), "d".to_string(), "swap signature at 4086".to_string()),
        ];
        hold_back(&mut scan, &config, &held);
        let left: Vec<(&str, &str)> = scan.volumes.iter().map(|v| (v.class.as_str(), v.entry.as_str())).collect();
        assert_eq!(left, vec![("fast", "b"), ("fast", "c"), ("other", "a")]);
        assert_eq!(scan.skipped.len(), 2, "a (unmarked) and d (marked, never claimed) are held");
        assert_eq!(scan.skipped[0].path, PathBuf::from("/mnt/fast/a"));
        assert!(matches!(&scan.skipped[0].reason, SkipReason::DeviceHeld(w) if w.contains("ext4")));
        assert!(scan.skipped[0].reason.is_safety_refusal());
    }
}

//! Reads and writes the durable "used" mark (see core::identity::used_mark for what it means): the
//! `trusted.` extended attribute on a filesystem volume's root, reached through a descriptor
//! opened without following links, and the node-local ledger for disks that cannot carry it.
//!
//! The ledger is one JSON file (`used-disks.json` in the state directory, a hostPath that
//! outlives the pod), rewritten whole through a temporary file, fsync and rename, so a crash
//! leaves either the old or the new version. An unreadable ledger is never reset: every disk
//! it may cover is held back until an operator repairs or removes it.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use serde::{Deserialize, Serialize};

use crate::core::identity::disk_identity::{Found, Verdict, judge};
use crate::core::identity::used_mark::{
    LedgerIndex, Relation, UsedMark, UsedRead, XATTR_NAME, is_offered, ledger_lookup_indexed, note_filesystem_wiped,
    offered_or_marked, prune_withdrawn, relate, wiped_by,
};

/// File name of the ledger inside the state directory.
pub const LEDGER_FILE: &str = "used-disks.json";

/// A mark that could not be read, written or cleared, with the path it was about.
#[derive(Debug, thiserror::Error)]
pub enum MarkError {
    /// A system call on the volume or the ledger failed (the host's one I/O error: which operation, which file).
    #[error(transparent)]
    Io(#[from] crate::host::HostError),
    /// The ledger file exists and is not a ledger.
    #[error("the used-disk ledger {path} cannot be read ({why}); repair or remove it (see docs/data-safety.md)")]
    Corrupt { path: PathBuf, why: String },
    /// The disk failed the mark: an I/O error reading it, or the filesystem made read-only by
    /// the kernel after an error (core::health::disk_health::read_only_after_error).
    #[error("{path}: {why}")]
    DiskFailing { path: PathBuf, why: String },
}

impl MarkError {
    fn io(op: &'static str, path: &Path, source: impl Into<std::io::Error>) -> Self {
        MarkError::Io(crate::host::HostError::io(op, path, source))
    }

    /// Whether the disk failed the call (EIO...: the failing sign `io-failure`).
    pub fn is_disk_failure(&self) -> bool {
        match self {
            MarkError::Io(e) => e.is_disk_failure(),
            MarkError::DiskFailing { .. } => true,
            MarkError::Corrupt { .. } => false,
        }
    }
}

/// A used mark that cannot be read: why, and whether the disk failed the read (EIO...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadableMark {
    /// What failed, with the path.
    pub why: String,
    /// The disk failed the read (the failing sign `io-failure`), rather than the mark being
    /// foreign or the call refused.
    pub disk_failed: bool,
}

impl std::fmt::Display for UnreadableMark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

/// Whether a filesystem can carry the attribute (tmpfs, ext4, XFS, btrfs can; vfat cannot).
fn unsupported(e: Errno) -> bool {
    e == Errno::NOTSUP || e == Errno::OPNOTSUPP
}

/// Opens a volume root for its attribute: a directory, never through a final symlink.
pub fn open_volume_root(path: &Path) -> Result<File, MarkError> {
    let fd =
        rustix::fs::open(path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| MarkError::io("open", path, e))?;
    Ok(File::from(fd))
}

/// The mark on a directory: `Ok(None)` when there is none or the filesystem cannot carry
/// one; `Unknown` when it cannot be read or is not a mark of ours.
pub fn read_dir_mark(fd: BorrowedFd<'_>, path: &Path) -> Result<Option<UsedMark>, UnreadableMark> {
    let mut buf = vec![0u8; 64 * 1024];
    match rustix::fs::fgetxattr(fd, XATTR_NAME, &mut buf[..]) {
        Ok(n) => UsedMark::from_json(&buf[..n]).map(Some).ok_or_else(|| UnreadableMark {
            why: format!("{XATTR_NAME} on {} is set but is not a mark of ours", path.display()),
            disk_failed: false,
        }),
        Err(Errno::NODATA) => Ok(None),
        Err(e) if unsupported(e) => Ok(None),
        Err(e) => Err(UnreadableMark {
            why: format!("reading {XATTR_NAME} on {}: {e}", path.display()),
            disk_failed: crate::host::health::disk_health::is_io_error(e),
        }),
    }
}

/// Where a written mark is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Carrier {
    /// On the filesystem itself (the attribute), and in the ledger: it travels with the disk.
    Attribute,
    /// A block device: in the ledger only, as for every block device.
    Ledger,
    /// A filesystem that cannot hold the attribute (vfat, exFAT, NFS, a read-only mount):
    /// in this node's ledger only, so it does not travel with the disk.
    LedgerOnly {
        /// Why the filesystem does not carry it.
        why: String,
        /// The ledger held no mark of this PV on this disk before: the first time its
        /// volume's mark is kept node-local only (what is reported, once; its later writes,
        /// the UID and the claim, are not).
        first: bool,
    },
}

/// Puts the mark on a directory and flushes it to the disk. `fs_type` names the filesystem in
/// what is returned when it cannot hold the attribute (the ledger then has to).
pub fn write_dir_mark(
    fd: BorrowedFd<'_>,
    path: &Path,
    fs_type: Option<&str>,
    mark: &UsedMark,
) -> Result<Carrier, MarkError> {
    let fs = fs_type.map_or_else(|| "its filesystem".to_string(), |t| format!("its filesystem ({t})"));
    let why = match rustix::fs::fsetxattr(fd, XATTR_NAME, mark.to_json().as_bytes(), rustix::fs::XattrFlags::empty()) {
        Ok(()) => None,
        Err(e) if unsupported(e) => Some(format!("{fs} cannot hold the extended attribute {XATTR_NAME}")),
        Err(Errno::ROFS) if crate::host::health::disk_health::read_only_after_error(fd) => {
            return Err(MarkError::DiskFailing {
                path: path.to_path_buf(),
                why: "the kernel made the filesystem read-only after an error (not an operator's read-only mount)"
                    .into(),
            });
        }
        Err(Errno::ROFS) => Some(format!("{fs} is mounted read-only")),
        Err(e) => return Err(MarkError::io("setting the used mark on", path, e)),
    };
    if let Some(why) = why {
        return Ok(Carrier::LedgerOnly { why, first: true });
    }
    rustix::fs::fsync(fd).map_err(|e| MarkError::io("fsync", path, e))?;
    Ok(Carrier::Attribute)
}

/// Removes the mark from a directory (after its wipe), flushed to the disk.
pub fn clear_dir_mark(fd: BorrowedFd<'_>, path: &Path) -> Result<(), MarkError> {
    match rustix::fs::fremovexattr(fd, XATTR_NAME) {
        Ok(()) => rustix::fs::fsync(fd).map_err(|e| MarkError::io("fsync", path, e)),
        Err(Errno::NODATA) => Ok(()),
        Err(e) if unsupported(e) => Ok(()),
        Err(e) => Err(MarkError::io("removing the used mark from", path, e)),
    }
}

/// What proves that the volume at a path is the recorded one, for writing its mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accept {
    /// The identity proves it (or equals the one found moments ago).
    Proven,
    /// Nothing found contradicts it (a used PV whose old-format record proves nothing):
    /// marking errs on the safe side.
    Plausible,
    /// Whatever volume is at the path (a used PV that recorded no identity, made by upstream):
    /// that is what kubelet mounts for it.
    Anything,
}

/// What [`mark_volume`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkOutcome {
    /// The attribute (on a directory that can carry it) is written and flushed; the mark
    /// still has to go into the ledger, in one batch, before the PV is created. The carrier
    /// says whether the disk itself carries it.
    Written(UsedMark, Carrier),
    /// `write` said no to the mark that is there (none, or another).
    Kept(Option<UsedMark>),
    /// The volume at the path is not proven to be the recorded disk: nothing was written.
    NotTheDisk(String),
    /// The disk failed the write or the read before it (an I/O error, or read-only after an
    /// error): the failing sign `io-failure`; nothing is published on it.
    DiskFailing(String),
}

/// Marks the volume at `path` as used by `mark.pv`, after proving on the descriptor it writes
/// through that it is the disk recorded as `recorded` (so a disk swapped in at the path is
/// never marked for another one's PV, and the right one never left unmarked unnoticed).
/// `write` decides from the mark there now whether to write. A directory gets the attribute;
/// every mark also goes into the ledger (the only record of a block device, and the one that
/// relates a subdirectory or the raw device to a used filesystem). The mark is returned for
/// the caller to record in one batch ([`Ledger::record`]): one ledger write per pass.
#[allow(clippy::too_many_arguments)] // What proves the disk, what to write, and where: all needed.
pub fn mark_volume(
    path: &Path,
    recorded: &str,
    confirmed: Option<&str>,
    accept: Accept,
    mark: &UsedMark,
    ledger: &Ledger,
    mounts: &crate::host::mounts::mountinfo::MountTable,
    write: impl FnOnce(Option<&UsedMark>) -> bool,
) -> Result<MarkOutcome, MarkError> {
    use crate::host::identity::fingerprint::{device_identity, directory_identity};
    use crate::host::volumes::volume::{EntryKind, mount_of_fd, resolve_entry};
    // The errno is kept, so a disk's I/O error stays one (MarkError::is_disk_failure).
    let io = |op, e: crate::host::HostError| match e {
        crate::host::HostError::Io { source, .. } => MarkError::io(op, path, source),
        other => MarkError::io(op, path, std::io::Error::other(other.to_string())),
    };
    let (kind, resolved) = resolve_entry(path).map_err(|e| io("resolving", e))?;
    // An identity equal to the one recorded also counts: a disk that names no stable device
    // (zram, some virtual disks) is never proven, and marking it errs on the safe side.
    let proven = |found: &Found| match judge(recorded, found, confirmed) {
        _ if found.identity == recorded || accept == Accept::Anything => None,
        Verdict::Same(_) => None,
        Verdict::Unproven { plausible: true, .. } if accept == Accept::Plausible => None,
        Verdict::Different(why) | Verdict::Unproven { reason: why, .. } => Some(why),
    };
    let mut mark = mark.clone();
    match kind {
        EntryKind::Directory => {
            let root = open_volume_root(&resolved)?;
            let found = directory_identity(root.as_fd(), &resolved, Some(mounts)).map_err(|e| io("identifying", e))?;
            if let Some(why) = proven(&found) {
                return Ok(MarkOutcome::NotTheDisk(why));
            }
            let mount = mount_of_fd(root.as_fd(), mounts);
            let dir = mount.map(|m| m.root.display().to_string());
            let there = match read_dir_mark(root.as_fd(), &resolved) {
                Ok(Some(m)) => Some(m),
                Ok(None) => match ledger.lookup(&found.identity, dir.as_deref()) {
                    UsedRead::Marked(m) | UsedRead::Offered(m) => Some(m),
                    _ => None,
                },
                Err(e) if e.disk_failed => return Err(MarkError::DiskFailing { path: resolved, why: e.why }),
                Err(_) => None,
            };
            if !write(there.as_ref()) {
                return Ok(MarkOutcome::Kept(there));
            }
            // First publication (no mark of any earlier one, and this one written before the
            // PV exists, so unclaimed): the root's mode and owner as the operator left them,
            // before any tenant, for the wipe to give back (wipe_fs). A PV made earlier (by
            // upstream, by an older version) may have had a tenant: nothing is recorded for it.
            if there.is_none() && mark.uid.is_none() && !mark.claimed {
                crate::host::wipe::wipe_fs::record_root(root.as_fd())
                    .map_err(|e| MarkError::io("recording the mode and owner of", &resolved, e))?;
            }
            mark.identity = found.identity;
            mark.root = dir;
            // A filesystem that cannot carry the attribute (or is mounted read-only) has only
            // the ledger's entry, which every mark gets anyway: the caller says so.
            let carrier = match write_dir_mark(root.as_fd(), &resolved, mount.map(|m| m.fs_type.as_str()), &mark)? {
                Carrier::LedgerOnly { why, .. } => {
                    Carrier::LedgerOnly { why, first: !ledger.has_mark_of(&mark.pv, &mark.identity) }
                }
                carrier => carrier,
            };
            Ok(MarkOutcome::Written(mark, carrier))
        }
        EntryKind::BlockDevice => {
            let file = File::open(&resolved).map_err(|e| MarkError::io("opening", &resolved, e))?;
            let found = device_identity(&file, &resolved).map_err(|e| io("identifying", e))?;
            if let Some(why) = proven(&found) {
                return Ok(MarkOutcome::NotTheDisk(why));
            }
            let there = match ledger.lookup(&found.identity, None) {
                UsedRead::Marked(m) | UsedRead::Offered(m) => Some(m),
                _ => None,
            };
            if !write(there.as_ref()) {
                return Ok(MarkOutcome::Kept(there));
            }
            mark.identity = found.identity;
            mark.root = None;
            Ok(MarkOutcome::Written(mark, Carrier::Ledger))
        }
        EntryKind::Symlink | EntryKind::Other => {
            Ok(MarkOutcome::NotTheDisk("neither a directory nor a block device".into()))
        }
    }
}

/// What the ledger file holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct LedgerData {
    /// Marks of used disks.
    used: Vec<UsedMark>,
    /// UIDs of PVs this agent withdrew while no claim had been seen on them, only while an
    /// unclaimed entry of `used` names them (core::identity::used_mark::prune_withdrawn): bounded by
    /// `used`, which a wipe empties.
    #[serde(default)]
    withdrawn: Vec<String>,
    /// `used` by what may relate a volume to them (not stored; rebuilt on load and change).
    #[serde(skip)]
    index: LedgerIndex,
    /// Counts this process's writes (not stored): who copies the ledger asks again only when it
    /// moved.
    #[serde(skip)]
    generation: u64,
}

/// A ledger's generation and the marks read at it, each with whether it was only offered.
pub type MarksAt = (u64, Vec<(UsedMark, bool)>);

/// The node-local ledger of used disks, shared by discovery, the create path and the wipes.
/// One agent per state directory: an exclusive lock taken at open, held for the process's
/// life, keeps a second agent (a surge pod, a second install) from losing its entries.
#[derive(Clone)]
pub struct Ledger {
    path: PathBuf,
    state: Arc<Mutex<Result<LedgerData, String>>>,
    /// The exclusive lock on the state directory, held while any clone lives.
    _lock: Option<Arc<File>>,
    /// False for a read-only view, whose writes fail.
    writable: bool,
}

impl Ledger {
    /// Loads the ledger in `state_dir` (created when missing). A ledger that exists and cannot
    /// be read is kept as it is, and every lookup answers "unknown" until it can.
    pub fn open(state_dir: &Path) -> Result<Self, MarkError> {
        std::fs::create_dir_all(state_dir).map_err(|e| MarkError::io("creating", state_dir, e))?;
        let lock_path = state_dir.join("lock");
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| MarkError::io("opening", &lock_path, e))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(|e| {
            MarkError::io("locking (is another agent using this --state-dir?)", &lock_path, std::io::Error::from(e))
        })?;
        let path = state_dir.join(LEDGER_FILE);
        let state = load(&path).map_err(|e| e.to_string());
        if let Err(e) = &state {
            tracing::error!(error = %e, "the used-disk ledger is unreadable; disks it may cover are held back");
        }
        Ok(Ledger { path, state: Arc::new(Mutex::new(state)), _lock: Some(Arc::new(lock)), writable: true })
    }

    /// The ledger in `state_dir` for reading only (the `discover` dry run, next to a running
    /// agent): not locked, and every write fails.
    pub fn read_only(state_dir: &Path) -> Result<Self, MarkError> {
        let path = state_dir.join(LEDGER_FILE);
        let state = load(&path).map_err(|e| e.to_string());
        Ok(Ledger { path, state: Arc::new(Mutex::new(state)), _lock: None, writable: false })
    }

    /// Reads the ledger again when it was unreadable, so an operator's repair (or removal) is
    /// taken up at the next pass without a restart. A readable ledger is never re-read: this
    /// process is its only writer.
    pub fn reload_if_unreadable(&self) {
        let Ok(mut state) = self.state.lock() else { return };
        if state.is_ok() {
            return;
        }
        match load(&self.path) {
            Ok(data) => {
                tracing::info!(ledger = %self.path.display(), entries = data.used.len(), "the used-disk ledger is readable again");
                *state = Ok(data);
            }
            Err(e) => *state = Err(e.to_string()),
        }
    }

    /// Where the ledger lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the ledger says about a volume found with `identity` (at `root`, for a filesystem).
    pub fn lookup(&self, identity: &str, root: Option<&str>) -> UsedRead {
        match self.state.lock().as_deref() {
            Ok(Ok(data)) => ledger_lookup_indexed(&data.used, &data.index, &data.withdrawn, identity, root),
            Ok(Err(why)) => UsedRead::Unknown(why.clone()),
            Err(_) => UsedRead::Unknown("the used-disk ledger's lock is poisoned".into()),
        }
    }

    /// Whether the ledger holds a mark of PV `pv` on a disk that may be the one found as
    /// `identity` (what names it, not whether that proves it: a disk with no stable name is
    /// still found by its device number). `false` when the ledger cannot be read.
    pub fn has_mark_of(&self, pv: &str, identity: &str) -> bool {
        match self.state.lock().as_deref() {
            Ok(Ok(data)) => data.index.candidates(&data.used, identity).iter().any(|m| m.pv == pv),
            _ => false,
        }
    }

    /// Whether the mark (from a disk's attribute) belongs to a PV this agent withdrew while
    /// it was unclaimed.
    pub fn classify(&self, mark: UsedMark) -> UsedRead {
        match self.state.lock().as_deref() {
            Ok(Ok(data)) => offered_or_marked(mark, &data.withdrawn),
            _ => UsedRead::Marked(mark),
        }
    }

    /// Records marks durably before returning: one write for a batch. A mark replaces the one
    /// of the same volume (identity and place).
    pub fn record(&self, marks: &[UsedMark]) -> Result<(), MarkError> {
        if marks.is_empty() {
            return Ok(());
        }
        self.update(|data| {
            for m in marks {
                // This volume's own older mark goes, and so do marks of the disk that say it
                // was never used (offered only, or a create that never happened): the new one
                // supersedes them. A used mark of another PV stays until a wipe.
                let withdrawn = &data.withdrawn;
                data.used.retain(|e| {
                    let same = e.identity == m.identity && e.root == m.root;
                    let itself = e.pv == m.pv && (e.uid == m.uid || e.uid.is_none());
                    let never_used = is_offered(e, withdrawn) || (e.uid.is_none() && e.pv == m.pv);
                    !(same && (never_used || itself))
                        && !(never_used && relate(e, &m.identity, m.root.as_deref()) == Relation::Holds)
                });
                data.used.push(m.clone());
            }
        })
    }

    /// Records, in one durable write, the marks that [`mark_volume`] wrote to the disks of a
    /// batch; when the ledger cannot be written, each of those outcomes becomes that error (the
    /// mark is not complete without its ledger entry).
    pub fn record_outcomes<'a>(&self, outcomes: impl Iterator<Item = &'a mut Result<MarkOutcome, String>>) {
        let mut written: Vec<&'a mut Result<MarkOutcome, String>> =
            outcomes.filter(|o| matches!(o, Ok(MarkOutcome::Written(..)))).collect();
        let marks: Vec<UsedMark> = written
            .iter()
            .filter_map(|o| if let Ok(MarkOutcome::Written(m, _)) = &**o { Some(m.clone()) } else { None })
            .collect();
        if let Err(e) = self.record(&marks) {
            for outcome in written.iter_mut() {
                **outcome = Err(e.to_string());
            }
        }
    }

    /// Records that this agent withdrew these PVs while no claim was on them (a precondition
    /// proved it): their disks' marks count as offered, not used.
    pub fn record_withdrawn(&self, uids: &[String]) -> Result<(), MarkError> {
        if uids.is_empty() {
            return Ok(());
        }
        self.update(|data| {
            for uid in uids {
                if !data.withdrawn.contains(uid) {
                    data.withdrawn.push(uid.clone());
                }
            }
        })
    }

    /// Forgets what the completed wipe of the volume found as `identity` (at `root`) removed
    /// (see core::identity::used_mark::wiped_by), and the withdrawals of the marks it removed; anything
    /// it did not wipe stays.
    pub fn clear(&self, identity: &str, root: Option<&str>) -> Result<(), MarkError> {
        self.update(|data| {
            data.used.retain(|e| !wiped_by(e, identity, root));
            for e in data.used.iter_mut() {
                note_filesystem_wiped(e, identity, root);
            }
        })
    }

    /// The marks of the ledger that `keep` keeps, each with whether it counts as offered only,
    /// and the ledger's generation (it changes with every write): the agent copies the
    /// portable block marks into its node's inventory (core::cluster::inventory), and asks again only
    /// when the generation moved. `Ok(None)` when the generation is `since`.
    pub fn marks_since(&self, since: Option<u64>, keep: impl Fn(&UsedMark) -> bool) -> Result<Option<MarksAt>, String> {
        match self.state.lock().as_deref() {
            Ok(Ok(data)) if Some(data.generation) == since => Ok(None),
            Ok(Ok(data)) => {
                let marks =
                    data.used.iter().filter(|m| keep(m)).map(|m| (m.clone(), is_offered(m, &data.withdrawn))).collect();
                Ok(Some((data.generation, marks)))
            }
            Ok(Err(why)) => Err(why.clone()),
            Err(_) => Err("the used-disk ledger's lock is poisoned".into()),
        }
    }

    /// Every mark of the ledger (to compare with the inventory's copy at start-up).
    pub fn marks(&self) -> Result<Vec<UsedMark>, String> {
        match self.state.lock().as_deref() {
            Ok(Ok(data)) => Ok(data.used.clone()),
            Ok(Err(why)) => Err(why.clone()),
            Err(_) => Err("the used-disk ledger's lock is poisoned".into()),
        }
    }

    /// Applies `change` and writes the ledger when it changed; the withdrawals no entry needs
    /// any more go in the same write.
    fn update(&self, change: impl FnOnce(&mut LedgerData)) -> Result<(), MarkError> {
        if !self.writable {
            return Err(MarkError::Corrupt { path: self.path.clone(), why: "opened read-only".into() });
        }
        let mut guard = self
            .state
            .lock()
            .map_err(|_| MarkError::Corrupt { path: self.path.clone(), why: "lock poisoned".into() })?;
        let data = guard.as_mut().map_err(|why| MarkError::Corrupt { path: self.path.clone(), why: why.clone() })?;
        // The change is made on a copy of the entries (not of the index, which is rebuilt), so
        // a failed write leaves the ledger in memory as it is on disk.
        let mut next = LedgerData {
            used: data.used.clone(),
            withdrawn: data.withdrawn.clone(),
            index: LedgerIndex::default(),
            generation: data.generation + 1,
        };
        change(&mut next);
        prune_withdrawn(&next.used, &mut next.withdrawn);
        if next.used == data.used && next.withdrawn == data.withdrawn {
            return Ok(());
        }
        save(&self.path, &next)?;
        // The old entries and their index go before the new index is built: with a thousand
        // disks, two copies of the ledger were the largest part of the agent's peak memory.
        *data = next;
        data.used.shrink_to_fit();
        data.index = LedgerIndex::build(&data.used);
        Ok(())
    }
}

fn load(path: &Path) -> Result<LedgerData, MarkError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice::<LedgerData>(&bytes)
            .map(|mut data| {
                data.index = LedgerIndex::build(&data.used);
                data
            })
            .map_err(|e| MarkError::Corrupt { path: path.to_path_buf(), why: e.to_string() }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(LedgerData::default()),
        Err(e) => Err(MarkError::Corrupt { path: path.to_path_buf(), why: e.to_string() }),
    }
}

/// Writes the whole ledger through a temporary file, fsync, rename and a directory fsync.
fn save(path: &Path, entries: &LedgerData) -> Result<(), MarkError> {
    let tmp = path.with_extension("json.tmp");
    let file = File::create(&tmp).map_err(|e| MarkError::io("creating", &tmp, e))?;
    // Encoded straight into the file: a ledger of a thousand disks is half a MiB of JSON that
    // need not be held in memory first.
    let mut out = std::io::BufWriter::new(file);
    serde_json::to_writer_pretty(&mut out, entries)
        .map_err(|e| MarkError::io("writing", &tmp, std::io::Error::other(e)))?;
    let file = out.into_inner().map_err(|e| MarkError::io("writing", &tmp, e.into_error()))?;
    file.sync_all().map_err(|e| MarkError::io("fsync", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| MarkError::io("renaming into", path, e))?;
    if let Some(dir) = path.parent() {
        let dir_file = File::open(dir).map_err(|e| MarkError::io("opening", dir, e))?;
        rustix::fs::fsync(dir_file.as_fd()).map_err(|e| MarkError::io("fsync", dir, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(identity: &str, uid: &str) -> UsedMark {
        UsedMark {
            pv: "local-pv-1".into(),
            node: "n".into(),
            path: "/mnt/disks/a".into(),
            identity: identity.into(),
            at: "t".into(),
            uid: Some(uid.into()),
            root: None,
            claimed: false,
            wiped_filesystems: Vec::new(),
        }
    }

    const BLK: &str = "v2;blk;disk=wwid:abc;size=100;dev=8:0";
    const OTHER: &str = "v2;blk;disk=wwid:zzz;size=100;dev=8:16";
    const TMPFS: &str = "v2;fs;fsid=9;volatile=tmpfs;ino=2;dev=0:1";

    #[test]
    fn ledger_survives_reopen_clears_only_the_wiped_disk_and_is_never_reset_when_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path()).unwrap();
        let tmpfs = UsedMark { root: Some("/".into()), ..mark(TMPFS, "u3") };
        ledger.record(&[mark(BLK, "u1"), mark(OTHER, "u2"), tmpfs]).unwrap();
        ledger.record_withdrawn(&["u2".into()]).unwrap();
        let mut outcomes = [Ok(MarkOutcome::Written(UsedMark { claimed: true, ..mark(BLK, "u1") }, Carrier::Ledger))];
        ledger.record_outcomes(outcomes.iter_mut());
        assert!(matches!(outcomes[0], Ok(MarkOutcome::Written(..))));
        // One agent per state directory; a read-only view (the dry run) next to it is fine.
        assert!(Ledger::open(dir.path()).is_err());
        // Offered, withdrawn unclaimed, then published again and used: the offered-only entry
        // is superseded, the used one is what the disk says from then on.
        const THIRD: &str = "v2;blk;disk=wwid:third;size=100;dev=8:32";
        ledger.record(&[mark(THIRD, "u5")]).unwrap();
        ledger.record_withdrawn(&["u5".into()]).unwrap();
        assert!(matches!(ledger.lookup(THIRD, None), UsedRead::Offered(_)));
        ledger.record(&[UsedMark { claimed: true, ..mark(THIRD, "u6") }]).unwrap();
        assert!(matches!(ledger.lookup(THIRD, None), UsedRead::Marked(m) if m.uid.as_deref() == Some("u6")));
        // A later mark of another PV never replaces a used one (only a wipe clears it).
        ledger.record(&[UsedMark { pv: "local-pv-9".into(), ..mark(THIRD, "u7") }]).unwrap();
        assert!(matches!(ledger.lookup(THIRD, None), UsedRead::Marked(m) if m.uid.as_deref() == Some("u6")));
        let view = Ledger::read_only(dir.path()).unwrap();
        assert!(matches!(view.lookup(BLK, None), UsedRead::Marked(_)));
        assert!(view.record(&[mark(OTHER, "u9")]).is_err() && view.record_withdrawn(&["u9".into()]).is_err());
        drop(ledger);
        let reopened = Ledger::open(dir.path()).unwrap();
        assert!(matches!(reopened.lookup(BLK, None), UsedRead::Marked(_)));
        assert!(matches!(reopened.lookup(OTHER, None), UsedRead::Offered(_)), "withdrawn unclaimed");
        assert!(matches!(reopened.lookup(TMPFS, Some("/")), UsedRead::Marked(_)));
        assert!(matches!(reopened.classify(mark(OTHER, "u2")), UsedRead::Offered(_)));
        assert!(matches!(reopened.classify(UsedMark { claimed: true, ..mark(OTHER, "u2") }), UsedRead::Marked(_)));
        reopened.clear(BLK, None).unwrap();
        reopened.clear(OTHER, None).unwrap();
        drop(reopened);
        let again = Ledger::open(dir.path()).unwrap();
        assert_eq!(again.lookup(BLK, None), UsedRead::Unmarked);
        assert_eq!(again.lookup(OTHER, None), UsedRead::Unmarked);
        assert!(matches!(again.lookup(TMPFS, Some("/")), UsedRead::Marked(_)));
        drop(again);

        std::fs::write(dir.path().join(LEDGER_FILE), b"{not json").unwrap();
        let corrupt = Ledger::open(dir.path()).unwrap();
        assert!(matches!(corrupt.lookup(OTHER, None), UsedRead::Unknown(_)));
        assert!(matches!(corrupt.lookup(TMPFS, Some("/")), UsedRead::Unknown(_)));
        assert!(corrupt.record(&[mark(BLK, "u1")]).is_err());
        // A batch whose ledger entries cannot be written is not marked.
        let mut outcomes = [Ok(MarkOutcome::Written(mark(BLK, "u1"), Carrier::Ledger)), Ok(MarkOutcome::Kept(None))];
        corrupt.record_outcomes(outcomes.iter_mut());
        assert!(outcomes[0].is_err() && outcomes[1] == Ok(MarkOutcome::Kept(None)), "{outcomes:?}");
        assert_eq!(std::fs::read(dir.path().join(LEDGER_FILE)).unwrap(), b"{not json", "never reset");
        corrupt.reload_if_unreadable();
        assert!(matches!(corrupt.lookup(OTHER, None), UsedRead::Unknown(_)), "still corrupt");
        // The operator repairs it: taken up without a restart.
        std::fs::write(dir.path().join(LEDGER_FILE), br#"{"used": []}"#).unwrap();
        corrupt.reload_if_unreadable();
        assert_eq!(corrupt.lookup(OTHER, None), UsedRead::Unmarked);
    }
}

//! Reads and writes the durable "used" mark (see core::used_mark for what it means): the
//! `trusted.` extended attribute on a filesystem volume's root, reached through a descriptor
//! opened without following links, and the node-local ledger for disks that cannot carry it.
//!
//! The ledger is one JSON file (`used-disks.json` in the state directory, a hostPath that
//! outlives the pod), rewritten whole through a temporary file, fsync and rename, so a crash
//! leaves either the old or the new version. An unreadable ledger is never reset: every disk
//! it may cover is held back until an operator repairs or removes it.

use std::fs::File;
use std::io::Write as _;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use crate::core::disk_identity::{DiskIdentity, Found, Verdict, judge, may_share_disk};
use crate::core::used_mark::{UsedMark, UsedRead, XATTR_NAME};

/// File name of the ledger inside the state directory.
pub const LEDGER_FILE: &str = "used-disks.json";

/// A mark that could not be read, written or cleared, with the path it was about.
#[derive(Debug, thiserror::Error)]
pub enum MarkError {
    /// A system call on the volume or the ledger failed.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The ledger file exists and is not a ledger.
    #[error("the used-disk ledger {path} cannot be read ({why}); repair or remove it (see docs/data-safety.md)")]
    Corrupt { path: PathBuf, why: String },
}

impl MarkError {
    fn io(op: &'static str, path: &Path, source: impl Into<std::io::Error>) -> Self {
        MarkError::Io { op, path: path.to_path_buf(), source: source.into() }
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
pub fn read_dir_mark(fd: BorrowedFd<'_>, path: &Path) -> Result<Option<UsedMark>, String> {
    let mut buf = vec![0u8; 4096];
    match rustix::fs::fgetxattr(fd, XATTR_NAME, &mut buf[..]) {
        Ok(n) => UsedMark::from_json(&buf[..n])
            .map(Some)
            .ok_or_else(|| format!("{XATTR_NAME} on {} is set but is not a mark of ours", path.display())),
        Err(Errno::NODATA) => Ok(None),
        Err(e) if unsupported(e) => Ok(None),
        Err(e) => Err(format!("reading {XATTR_NAME} on {}: {e}", path.display())),
    }
}

/// Puts the mark on a directory and flushes it to the disk. Returns `false` when the
/// filesystem cannot carry attributes (the ledger then has to).
pub fn write_dir_mark(fd: BorrowedFd<'_>, path: &Path, mark: &UsedMark) -> Result<bool, MarkError> {
    match rustix::fs::fsetxattr(fd, XATTR_NAME, mark.to_json().as_bytes(), rustix::fs::XattrFlags::empty()) {
        Ok(()) => {}
        Err(e) if unsupported(e) => return Ok(false),
        Err(e) => return Err(MarkError::io("setting the used mark on", path, e)),
    }
    rustix::fs::fsync(fd).map_err(|e| MarkError::io("fsync", path, e))?;
    Ok(true)
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

/// Whether the ledger must record a disk: every block device (one with no stable ID too: a
/// later match by device number alone then holds a disk back rather than let it through), and
/// filesystems with a device under them (which could later be exposed as a block volume). A
/// tmpfs or a filesystem with no device names nothing that outlives it, and carries its mark.
pub fn ledger_keeps(identity: &str) -> bool {
    DiskIdentity::parse(identity).is_some_and(|d| d.kind == crate::core::disk_identity::Kind::Block || d.disk.is_some())
}

/// What the ledger says about one found identity. Pure, over the ledger's entries.
pub fn ledger_lookup(entries: &[UsedMark], found: &str) -> UsedRead {
    let found_disk = DiskIdentity::parse(found).and_then(|d| d.disk);
    let mut doubtful = None;
    for entry in entries.iter().filter(|e| may_share_disk(&e.identity, found)) {
        let recorded_disk = DiskIdentity::parse(&entry.identity).and_then(|d| d.disk);
        let same_device = recorded_disk.is_some() && recorded_disk == found_disk;
        let proven = same_device || matches!(judge(&entry.identity, &as_found(found), None), Verdict::Same(_));
        if proven {
            return UsedRead::Marked(entry.clone());
        }
        doubtful.get_or_insert(entry);
    }
    match doubtful {
        Some(entry) => UsedRead::Unknown(format!(
            "the used-disk ledger records PV {}'s disk ({}) which may be this one ({found}) and nothing proves \
             either way",
            entry.pv, entry.identity
        )),
        None => UsedRead::Unmarked,
    }
}

/// What [`mark_volume`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkOutcome {
    /// The attribute (if any) is written and flushed; the mark still has to go into the
    /// ledger (in one batch, before the PV is created) when it is `Some` here.
    Written(Option<UsedMark>),
    /// `write` said no to the mark that is there (none, or another).
    Kept(Option<UsedMark>),
    /// The volume at the path is not proven to be the recorded disk: nothing was written.
    NotTheDisk(String),
}

/// Marks the volume at `path` as used by `mark.pv`, after proving on the descriptor it writes
/// through that it is the disk recorded as `recorded` (so a disk swapped in at the path is
/// never marked for another one's PV, and the right one never left unmarked unnoticed).
/// `write` decides from the mark there now whether to write. A directory gets the attribute
/// (and a ledger entry when it has a device under it, or cannot carry the attribute); a block
/// device only the ledger entry. Ledger entries are returned for the caller to record in one
/// batch ([`Ledger::record`]): one rewrite of the ledger per pass, not per volume.
pub fn mark_volume(
    path: &Path,
    recorded: &str,
    confirmed: Option<&str>,
    mark: &UsedMark,
    ledger: &Ledger,
    mounts: &crate::host::mountinfo::MountTable,
    write: impl FnOnce(Option<&UsedMark>) -> bool,
) -> Result<MarkOutcome, MarkError> {
    use crate::host::identity::{device_identity, directory_identity};
    use crate::host::volume::{EntryKind, resolve_entry};
    let io = |op, e: crate::host::HostError| MarkError::io(op, path, std::io::Error::other(e.to_string()));
    let (kind, resolved) = resolve_entry(path).map_err(|e| io("resolving", e))?;
    // An identity equal to the one recorded also counts: a disk that names no stable device
    // (zram, some virtual disks) is never proven, and marking it errs on the safe side.
    let proven = |found: &Found| match judge(recorded, found, confirmed) {
        _ if found.identity == recorded => None,
        Verdict::Same(_) => None,
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
            let there = match read_dir_mark(root.as_fd(), &resolved) {
                Ok(Some(m)) => Some(m),
                Ok(None) => match ledger.lookup(&found.identity) {
                    UsedRead::Marked(m) => Some(m),
                    _ => None,
                },
                Err(_) => None,
            };
            if !write(there.as_ref()) {
                return Ok(MarkOutcome::Kept(there));
            }
            mark.identity = found.identity;
            let carried = write_dir_mark(root.as_fd(), &resolved, &mark)?;
            if !carried && !ledger_keeps(&mark.identity) {
                return Err(MarkError::io(
                    "marking",
                    path,
                    std::io::Error::other(
                        "the filesystem carries no extended attributes and names no device to ledger",
                    ),
                ));
            }
            Ok(MarkOutcome::Written(ledger_keeps(&mark.identity).then_some(mark)))
        }
        EntryKind::BlockDevice => {
            let file = File::open(&resolved).map_err(|e| MarkError::io("opening", &resolved, e))?;
            let found = device_identity(&file, &resolved).map_err(|e| io("identifying", e))?;
            if let Some(why) = proven(&found) {
                return Ok(MarkOutcome::NotTheDisk(why));
            }
            let there = match ledger.lookup(&found.identity) {
                UsedRead::Marked(m) => Some(m),
                _ => None,
            };
            if !write(there.as_ref()) {
                return Ok(MarkOutcome::Kept(there));
            }
            mark.identity = found.identity;
            Ok(MarkOutcome::Written(Some(mark)))
        }
        EntryKind::Symlink | EntryKind::Other => {
            Ok(MarkOutcome::NotTheDisk("neither a directory nor a block device".into()))
        }
    }
}

fn as_found(identity: &str) -> Found {
    Found { identity: identity.to_string(), ..Default::default() }
}

/// The node-local ledger of used disks, shared by discovery, the create path and the wipes.
#[derive(Clone)]
pub struct Ledger {
    path: PathBuf,
    state: Arc<Mutex<Result<Vec<UsedMark>, String>>>,
}

impl Ledger {
    /// Loads the ledger in `state_dir` (created when missing). A ledger that exists and cannot
    /// be read is kept as it is, and every lookup answers "unknown" until it can.
    pub fn open(state_dir: &Path) -> Result<Self, MarkError> {
        std::fs::create_dir_all(state_dir).map_err(|e| MarkError::io("creating", state_dir, e))?;
        let path = state_dir.join(LEDGER_FILE);
        let state = load(&path).map_err(|e| e.to_string());
        if let Err(e) = &state {
            tracing::error!(error = %e, "the used-disk ledger is unreadable; disks it may cover are held back");
        }
        Ok(Ledger { path, state: Arc::new(Mutex::new(state)) })
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
            Ok(entries) => {
                tracing::info!(ledger = %self.path.display(), entries = entries.len(), "the used-disk ledger is readable again");
                *state = Ok(entries);
            }
            Err(e) => *state = Err(e.to_string()),
        }
    }

    /// Where the ledger lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the ledger says about a disk found with `identity`.
    pub fn lookup(&self, identity: &str) -> UsedRead {
        match self.state.lock().as_deref() {
            Ok(Ok(entries)) => ledger_lookup(entries, identity),
            // A disk that names no device was never ledgered: an unreadable ledger hides nothing.
            Ok(Err(_)) if !ledger_keeps(identity) => UsedRead::Unmarked,
            Ok(Err(why)) => UsedRead::Unknown(why.clone()),
            Err(_) => UsedRead::Unknown("the used-disk ledger's lock is poisoned".into()),
        }
    }

    /// Records marks (those [`ledger_keeps`]) durably before returning: one write for a batch.
    pub fn record(&self, marks: &[UsedMark]) -> Result<(), MarkError> {
        let keep: Vec<&UsedMark> = marks.iter().filter(|m| ledger_keeps(&m.identity)).collect();
        if keep.is_empty() {
            return Ok(());
        }
        self.update(|entries| {
            for m in keep {
                entries.retain(|e| e.identity != m.identity);
                entries.push(m.clone());
            }
        })
    }

    /// Forgets the disk just wiped (proven to be `identity` on the wipe's own descriptor):
    /// entries proven to be that disk go; any that only may be it stay.
    pub fn clear(&self, identity: &str) -> Result<(), MarkError> {
        self.update(|entries| {
            entries.retain(|e| {
                e.identity != identity
                    && !matches!(ledger_lookup(std::slice::from_ref(e), identity), UsedRead::Marked(_))
            })
        })
    }

    fn update(&self, change: impl FnOnce(&mut Vec<UsedMark>)) -> Result<(), MarkError> {
        let mut guard = self
            .state
            .lock()
            .map_err(|_| MarkError::Corrupt { path: self.path.clone(), why: "lock poisoned".into() })?;
        let entries = guard.as_mut().map_err(|why| MarkError::Corrupt { path: self.path.clone(), why: why.clone() })?;
        let mut next = entries.clone();
        change(&mut next);
        if next == *entries {
            return Ok(());
        }
        save(&self.path, &next)?;
        *entries = next;
        Ok(())
    }
}

fn load(path: &Path) -> Result<Vec<UsedMark>, MarkError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| MarkError::Corrupt { path: path.to_path_buf(), why: e.to_string() }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(MarkError::Corrupt { path: path.to_path_buf(), why: e.to_string() }),
    }
}

/// Writes the whole ledger through a temporary file, fsync, rename and a directory fsync.
fn save(path: &Path, entries: &[UsedMark]) -> Result<(), MarkError> {
    let text =
        serde_json::to_vec_pretty(entries).map_err(|e| MarkError::io("encoding", path, std::io::Error::other(e)))?;
    let tmp = path.with_extension("json.tmp");
    let mut file = File::create(&tmp).map_err(|e| MarkError::io("creating", &tmp, e))?;
    file.write_all(&text).map_err(|e| MarkError::io("writing", &tmp, e))?;
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

    fn mark(identity: &str) -> UsedMark {
        UsedMark {
            pv: "local-pv-1".into(),
            node: "n".into(),
            path: "/mnt/disks/a".into(),
            identity: identity.into(),
            at: "t".into(),
            uid: Some("u".into()),
        }
    }

    const BLK: &str = "v2;blk;disk=wwid:abc;size=100;dev=8:0";
    const FS_ON_IT: &str = "v2;fs;disk=wwid:abc;uuid=u1;ino=2;dev=8:0";
    const OTHER: &str = "v2;blk;disk=wwid:zzz;size=100;dev=8:16";
    const PART: &str = "v2;blk;disk=wwid:abc/part1@2048;size=50;dev=8:1";
    const UNNAMED: &str = "v2;fs;fsid=1-2;ino=2;dev=0:50";
    const UNNAMED_SAME_NUMBER: &str = "v2;fs;fsid=3-4;ino=2;dev=0:50";

    #[test]
    fn lookup_finds_the_disk_under_any_of_its_forms_and_doubts_what_it_cannot_prove() {
        let entries = vec![mark(BLK)];
        assert!(matches!(ledger_lookup(&entries, BLK), UsedRead::Marked(_)));
        // The same device, formatted and mounted as a Filesystem volume.
        assert!(matches!(ledger_lookup(&[mark(FS_ON_IT)], BLK), UsedRead::Marked(_)));
        assert!(matches!(ledger_lookup(&entries, FS_ON_IT), UsedRead::Marked(_)));
        assert_eq!(ledger_lookup(&entries, OTHER), UsedRead::Unmarked);
        // A partition of the recorded disk shares its data but is not it: held, not wiped.
        assert!(matches!(ledger_lookup(&entries, PART), UsedRead::Unknown(_)));
        // Nothing named on either side: the same device number is only a doubt.
        assert!(matches!(ledger_lookup(&[mark(UNNAMED)], UNNAMED_SAME_NUMBER), UsedRead::Unknown(_)));
        assert_eq!(ledger_lookup(&[], BLK), UsedRead::Unmarked);
    }

    #[test]
    fn only_disks_with_a_device_are_kept() {
        assert!(ledger_keeps(BLK) && ledger_keeps(FS_ON_IT));
        assert!(!ledger_keeps(UNNAMED) && !ledger_keeps("v2;fs;fsid=9;volatile=tmpfs;ino=2;dev=0:1"));
        assert!(ledger_keeps("v2;blk;size=100;dev=8:0"), "a block device without a stable ID is kept too");
        assert!(!ledger_keeps("garbage"));
    }

    #[test]
    fn ledger_survives_reopen_clears_only_the_wiped_disk_and_is_never_reset_when_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path()).unwrap();
        ledger.record(&[mark(BLK), mark(OTHER), mark(UNNAMED)]).unwrap();
        let reopened = Ledger::open(dir.path()).unwrap();
        assert!(matches!(reopened.lookup(BLK), UsedRead::Marked(_)));
        assert!(matches!(reopened.lookup(OTHER), UsedRead::Marked(_)));
        assert_eq!(reopened.lookup(UNNAMED), UsedRead::Unmarked, "tmpfs-like disks are not ledgered");
        reopened.clear(BLK).unwrap();
        let again = Ledger::open(dir.path()).unwrap();
        assert_eq!(again.lookup(BLK), UsedRead::Unmarked);
        assert!(matches!(again.lookup(OTHER), UsedRead::Marked(_)));

        std::fs::write(dir.path().join(LEDGER_FILE), b"{not json").unwrap();
        let corrupt = Ledger::open(dir.path()).unwrap();
        assert!(matches!(corrupt.lookup(OTHER), UsedRead::Unknown(_)));
        assert!(matches!(corrupt.lookup("v2;blk;disk=wwid:new;size=1;dev=8:32"), UsedRead::Unknown(_)));
        assert_eq!(corrupt.lookup(UNNAMED), UsedRead::Unmarked);
        assert!(corrupt.record(&[mark(BLK)]).is_err());
        assert_eq!(std::fs::read(dir.path().join(LEDGER_FILE)).unwrap(), b"{not json", "never reset");
        corrupt.reload_if_unreadable();
        assert!(matches!(corrupt.lookup(OTHER), UsedRead::Unknown(_)), "still corrupt");
        // The operator repairs it: taken up without a restart.
        std::fs::write(dir.path().join(LEDGER_FILE), b"[]").unwrap();
        corrupt.reload_if_unreadable();
        assert_eq!(corrupt.lookup(OTHER), UsedRead::Unmarked);
    }
}

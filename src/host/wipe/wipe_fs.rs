//! Filesystem wipe: empties a released Filesystem volume in-process before its PV is offered
//! again, keeping the mount point itself in place and leaving it as a new volume's root: no
//! extended attribute or inode flag a tenant could have set, and the mode and owner a fresh
//! filesystem gives its root (the rule is core::wipe::volume_root; the agent's own `trusted.` used
//! mark stays for the caller to clear).
//!
//! Data safety comes first. Every step is relative to an open directory descriptor, symlinks are
//! removed but never followed, and the walk refuses to enter another mount (by device and by
//! mount ID, so a bind mount of the same filesystem is caught too): a tree that changes under the
//! wipe can make it stop with an error, never delete outside the volume. The walk is iterative
//! with a bounded number of open directory streams, so depth costs neither stack nor file
//! descriptors, and each directory stream stays open while it is processed (linear time).

use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rustix::fs::{
    AtFlags, CWD, Dir, FileType, IFlags, Mode, OFlags, StatxAttributes, StatxFlags, fchmod, fstat, fstatfs,
    ioctl_getflags, makedev, openat, statat, statx, unlinkat,
};
use rustix::io::Errno;

use crate::core::wipe::volume_root::{
    ConfiguredRoot, FlagsPlan, ROOT_RECORD_XATTR, RootOwnership, flag_names, fresh_root, plan_flags, plan_ownership,
    removes_xattr, target_ownership,
};
use crate::host::mounts::mountinfo::MountTable;

/// What a wipe removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FsWipeStats {
    /// Non-directories unlinked (files, symlinks, devices, sockets, FIFOs).
    pub files: u64,
    /// Directories removed (the volume root is kept and not counted).
    pub dirs: u64,
    /// Used space given back, from statfs before and after (0 if usage grew meanwhile).
    pub bytes_freed: u64,
}

/// Why a wipe stopped. Every variant names the full path it is about, so an operator can act.
#[derive(Debug, thiserror::Error)]
pub enum FsWipeError {
    /// Another mount inside the volume: wiping across it would delete another volume's data.
    #[error("{} is a mount point inside the volume; refusing to wipe across it", .path.display())]
    NestedMount { path: PathBuf },
    /// An immutable or append-only entry (`chattr +i`/`+a`): not even root can remove it, so
    /// retrying is pointless until an operator clears the flag.
    #[error("{} is immutable or append-only (chattr -i / chattr -a to allow the wipe)", .path.display())]
    Immutable { path: PathBuf },
    /// Something changed the tree during the wipe in a way that makes continuing unsafe.
    #[error("{} changed during the wipe: {detail}", .path.display())]
    TreeChanged { path: PathBuf, detail: String },
    /// The cancel flag was set (a timeout): the volume is partly wiped.
    #[error("wipe of {} cancelled", .path.display())]
    Cancelled { path: PathBuf },
    /// The root is not a mount point: wiping it would empty a plain host directory.
    #[error("{} is not a mount point; refusing to wipe it", .path.display())]
    NotMounted { path: PathBuf },
    /// The directory opened for the wipe is not the volume that was published (checked on the
    /// very descriptor the wipe walks from).
    #[error("{}: {reason}", .path.display())]
    NotTheVolume { path: PathBuf, reason: String },
    /// The root's own metadata could not be made a new volume's: offered so, the next tenant
    /// would read what the last one left on it (`what` names the attribute, flags or mode).
    #[error("{}: {what} is left from the last tenant and could not be reset: {detail}", .path.display())]
    RootMetadata { path: PathBuf, what: String, detail: String },
    /// A system call failed (the host's one I/O error: which operation, which file).
    #[error(transparent)]
    Io(#[from] crate::host::HostError),
}

/// Directory streams kept open at once; deeper levels are closed and later reopened through `..`.
const MAX_OPEN_STREAMS: usize = 64;
/// Entries read between two looks at the cancel flag.
const CANCEL_EVERY: u32 = 256;
/// Re-reads of a directory that keeps getting new entries before giving up.
const MAX_RESCANS: u32 = 3;
/// Times an entry may switch between directory and non-directory under us before giving up.
const MAX_TYPE_FLIPS: u32 = 3;
/// `chattr +i` (not even root can unlink the entry) and `chattr +a` (not even root can unlink
/// the entry or, for a directory, entries in it).
const FORBID_UNLINK: IFlags = IFlags::IMMUTABLE.union(IFlags::APPEND);
/// How subdirectories are opened: never through a symlink, never as a controlling terminal.
const DIR_FLAGS: OFlags = OFlags::RDONLY.union(OFlags::DIRECTORY).union(OFlags::NOFOLLOW).union(OFlags::CLOEXEC);

/// Removes everything below `root` (an absolute path of a mounted volume), keeping `root` itself
/// and resetting its own metadata as a new volume's (core::wipe::volume_root). `mounts` is the
/// current mount table; `cancel` is polled often.
pub fn wipe_filesystem(root: &Path, mounts: &MountTable, cancel: &AtomicBool) -> Result<FsWipeStats, FsWipeError> {
    wipe_filesystem_verified(root, mounts, cancel, &mut |_| Ok(()))
}

/// [`wipe_filesystem`], calling `verify` with the root directory's descriptor once it is open
/// and before anything is removed: the caller proves on that very descriptor that it is the
/// published volume (a mount swapped in at the path after an earlier check is then caught,
/// since the walk starts from this descriptor, not from the path).
pub fn wipe_filesystem_verified(
    root: &Path,
    mounts: &MountTable,
    cancel: &AtomicBool,
    verify: &mut dyn FnMut(BorrowedFd<'_>) -> Result<(), String>,
) -> Result<FsWipeStats, FsWipeError> {
    wipe_filesystem_counted(root, mounts, cancel, None, ConfiguredRoot::default(), verify)
}

/// [`wipe_filesystem_verified`], adding the entries it goes through to `beats` as it goes:
/// the caller tells a wipe that progresses from one stuck in the kernel.
pub fn wipe_filesystem_counted(
    root: &Path,
    mounts: &MountTable,
    cancel: &AtomicBool,
    beats: Option<&AtomicU64>,
    configured_root: ConfiguredRoot,
    verify: &mut dyn FnMut(BorrowedFd<'_>) -> Result<(), String>,
) -> Result<FsWipeStats, FsWipeError> {
    let mut wiper = Wiper::open(root, mounts, cancel)?;
    wiper.beats = beats;
    wiper.configured_root = configured_root;
    verify(wiper.root_fd.as_fd()).map_err(|reason| FsWipeError::NotTheVolume { path: root.to_path_buf(), reason })?;
    wiper.finish()
}

/// An open directory stream: rustix's `Dir` fetches many entries per getdents64 call and
/// owns the descriptor, which the walk also uses for the `*at` calls in that directory.
struct DirStream(Dir);

impl DirStream {
    /// Takes ownership of `fd` (closed on error too).
    fn new(fd: OwnedFd) -> Result<Self, Errno> {
        Dir::new(fd).map(DirStream)
    }

    fn fd(&self) -> Result<BorrowedFd<'_>, Errno> {
        self.0.fd()
    }

    /// The next entry's name and type (`Unknown` where the filesystem has no `d_type`), or
    /// None at the end.
    fn next(&mut self) -> Result<Option<(CString, FileType)>, Errno> {
        match self.0.read() {
            None => Ok(None),
            Some(Ok(entry)) => Ok(Some((entry.file_name().to_owned(), entry.file_type()))),
            Some(Err(e)) => Err(e),
        }
    }

    /// Starts over: the next read sees the directory as it is now.
    fn rewind(&mut self) {
        self.0.rewind();
    }
}

/// What the walk needs to know about a directory it opened.
#[derive(Debug, Clone, Copy)]
struct DirInfo {
    dev: u64,
    ino: u64,
    mode: u32,
    /// Mount ID when the kernel reports it (5.8+): a bind mount shares `dev` but not this.
    mnt_id: Option<u64>,
    /// Whether this is the root of a mount, when the kernel reports it (5.8+).
    mount_root: Option<bool>,
}

fn dir_info(fd: BorrowedFd<'_>) -> Result<DirInfo, Errno> {
    let st = match statx(fd, c"", AtFlags::EMPTY_PATH, StatxFlags::BASIC_STATS | StatxFlags::MNT_ID) {
        Ok(st) => st,
        // Kernels before 4.11, or seccomp profiles that predate statx.
        Err(Errno::NOSYS | Errno::PERM) => {
            let st = fstat(fd)?;
            #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
            return Ok(DirInfo {
                dev: st.st_dev as u64,
                ino: st.st_ino as u64,
                mode: st.st_mode as u32,
                mnt_id: None,
                mount_root: None,
            });
        }
        Err(e) => return Err(e),
    };
    Ok(DirInfo {
        dev: makedev(st.stx_dev_major, st.stx_dev_minor),
        ino: st.stx_ino,
        mode: u32::from(st.stx_mode),
        mnt_id: StatxFlags::from_bits_retain(st.stx_mask).contains(StatxFlags::MNT_ID).then_some(st.stx_mnt_id),
        mount_root: st
            .stx_attributes_mask
            .contains(StatxAttributes::MOUNT_ROOT)
            .then_some(st.stx_attributes.contains(StatxAttributes::MOUNT_ROOT)),
    })
}

/// Used bytes of the filesystem holding `fd`.
fn used_bytes(fd: BorrowedFd<'_>) -> Result<u64, Errno> {
    let st = fstatfs(fd)?;
    let used = st.f_blocks.saturating_sub(st.f_bfree);
    Ok(used.saturating_mul(u64::try_from(st.f_bsize).unwrap_or(0)))
}

/// Whether the open file or directory has the immutable or append-only flag.
fn flags_forbid_unlink(fd: BorrowedFd<'_>) -> bool {
    ioctl_getflags(fd).is_ok_and(|flags| flags.intersects(FORBID_UNLINK))
}

/// The root's mode and owner as first published ([`ROOT_RECORD_XATTR`]), if recorded and
/// readable (anything else: a fresh filesystem's root is the target).
fn read_root_record(fd: BorrowedFd<'_>) -> Option<RootOwnership> {
    let mut buf = [0u8; 128];
    let n = rustix::fs::fgetxattr(fd, ROOT_RECORD_XATTR, &mut buf[..]).ok()?;
    RootOwnership::from_record(&buf[..n])
}

/// Records the root's mode and owner as they are now, unless recorded before: called when the
/// volume is first published, before any tenant. A filesystem that cannot hold the attribute
/// (or is read-only) gets none; its root is then reset to a fresh filesystem's.
pub fn record_root(fd: BorrowedFd<'_>) -> Result<(), Errno> {
    let st = fstat(fd)?;
    #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
    let now = RootOwnership { mode: st.st_mode as u32, uid: st.st_uid, gid: st.st_gid };
    let value = now.to_record();
    match rustix::fs::fsetxattr(fd, ROOT_RECORD_XATTR, value.as_bytes(), rustix::fs::XattrFlags::CREATE) {
        Ok(()) | Err(Errno::EXIST | Errno::NOTSUP | Errno::ROFS) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The names of the extended attributes of `fd` (none where the filesystem has none).
fn list_xattrs(fd: BorrowedFd<'_>) -> Result<Vec<CString>, Errno> {
    let mut buf = vec![0u8; 4096];
    for _ in 0..4 {
        match rustix::fs::flistxattr(fd, &mut buf[..]) {
            Ok(n) => {
                let names = buf[..n].split(|b| *b == 0).filter(|n| !n.is_empty());
                return Ok(names.filter_map(|n| CString::new(n).ok()).collect());
            }
            Err(Errno::NOTSUP) => return Ok(Vec::new()),
            // Grown since: ask for the size and read again.
            Err(Errno::RANGE) => {
                let size = rustix::fs::flistxattr_query(fd)?;
                buf.resize(size.max(buf.len() * 2), 0);
            }
            Err(e) => return Err(e),
        }
    }
    // Growing every time it is read: someone is writing attributes on the root meanwhile.
    Err(Errno::RANGE)
}

/// Whether entry `name` of `dir` is immutable or append-only. Only regular files and
/// directories are opened: opening a device node could have side effects.
fn entry_forbids_unlink(dir: BorrowedFd<'_>, name: &CStr) -> bool {
    let Ok(st) = statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) else { return false };
    if !matches!(FileType::from_raw_mode(st.st_mode), FileType::RegularFile | FileType::Directory) {
        return false;
    }
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    match openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => flags_forbid_unlink(fd.as_fd()),
        Err(_) => false,
    }
}

/// Gives entry `name` of `dir` mode 0o700 unless it is a symlink (then nothing changes; the
/// open that follows fails on it). The one call left to nix: rustix refuses
/// AT_SYMLINK_NOFOLLOW for chmodat because the fchmodat system call has no flags before Linux
/// 6.6, while the C library implements it without following (fchmodat2, else an O_PATH
/// descriptor that it checks is no symlink).
fn chmod_owner_only_nofollow(dir: BorrowedFd<'_>, name: &CStr) {
    use nix::sys::stat::{FchmodatFlags, Mode as NixMode, fchmodat};
    let _ = fchmodat(dir, name, NixMode::S_IRWXU, FchmodatFlags::NoFollowSymlink);
}

/// One directory on the path from the root to where the walk is.
struct Frame {
    /// Name in the parent (empty for the root).
    name: CString,
    /// Identity recorded when first entered, checked when reopened through `..`.
    dev: u64,
    ino: u64,
    mode: u32,
    /// None when closed to bound open descriptors.
    stream: Option<DirStream>,
    /// Whether we already added u+rwx (at most once per directory).
    perms_fixed: bool,
    /// Times re-read because entries appeared.
    rescans: u32,
    /// Whether an entry was seen since the last (re)start of the stream.
    dirty: bool,
}

/// The state of one volume's wipe.
struct Wiper<'a> {
    root: &'a Path,
    cancel: &'a AtomicBool,
    root_fd: OwnedFd,
    root_mode: u32,
    root_dev: u64,
    root_mnt_id: Option<u64>,
    root_mode_changed: bool,
    /// The mode and owner a fresh filesystem of this mount gives its root (None: it stores none).
    fresh_root: Option<RootOwnership>,
    used_before: u64,
    /// `stack[0]` is the root; the last frame is where the walk is and is always open.
    stack: Vec<Frame>,
    /// Frames `1..first_open` have closed streams; all later ones are open.
    first_open: usize,
    open_streams: usize,
    max_open_streams: usize,
    since_cancel_check: u32,
    stats: FsWipeStats,
    /// Where the entries gone through are counted, if anywhere.
    beats: Option<&'a AtomicU64>,
    /// The class's `rootMode`/`rootOwner`: what the reset gives the root before anything else.
    configured_root: ConfiguredRoot,
}

impl<'a> Wiper<'a> {
    /// Checks that `root` is a mount point of `mounts` with nothing mounted below, and opens it.
    fn open(root: &'a Path, mounts: &MountTable, cancel: &'a AtomicBool) -> Result<Self, FsWipeError> {
        let Some(mount) = mounts.get(root) else {
            return Err(FsWipeError::NotMounted { path: root.to_path_buf() });
        };
        if let Some(nested) = mounts.mounts_below(root).next() {
            return Err(FsWipeError::NestedMount { path: nested.mount_point.clone() });
        }
        if cancel.load(Ordering::Relaxed) {
            return Err(FsWipeError::Cancelled { path: root.to_path_buf() });
        }
        let io = |op: &'static str, e: Errno| FsWipeError::Io(crate::host::HostError::io(op, root, e));
        let root_fd = openat(CWD, root, DIR_FLAGS, Mode::empty()).map_err(|e| io("open", e))?;
        let info = dir_info(root_fd.as_fd()).map_err(|e| io("stat", e))?;
        // The table may be stale: make sure what we opened is that very mount.
        if info.mount_root == Some(false) {
            return Err(FsWipeError::NotMounted { path: root.to_path_buf() });
        }
        if let Some(id) = info.mnt_id
            && id != u64::from(mount.id)
        {
            return Err(FsWipeError::TreeChanged {
                path: root.to_path_buf(),
                detail: format!(
                    "its mount ID is {id}, not the mount table's {}: remounted since the table was read",
                    mount.id
                ),
            });
        }
        let used_before = used_bytes(root_fd.as_fd()).map_err(|e| io("statfs", e))?;
        let stream_fd = openat(&root_fd, c".", DIR_FLAGS, Mode::empty()).map_err(|e| io("open", e))?;
        let stream = DirStream::new(stream_fd).map_err(|e| io("opendir", e))?;
        Ok(Wiper {
            root,
            cancel,
            root_fd,
            root_mode: info.mode,
            root_dev: info.dev,
            root_mnt_id: info.mnt_id,
            root_mode_changed: false,
            fresh_root: fresh_root(&mount.fs_type, &mount.super_options),
            used_before,
            stack: vec![Frame {
                name: CString::default(),
                dev: info.dev,
                ino: info.ino,
                mode: info.mode,
                stream: Some(stream),
                perms_fixed: false,
                rescans: 0,
                dirty: false,
            }],
            first_open: 1,
            open_streams: 1,
            max_open_streams: MAX_OPEN_STREAMS,
            since_cancel_check: 0,
            stats: FsWipeStats::default(),
            beats: None,
            configured_root: ConfiguredRoot::default(),
        })
    }

    /// Runs the wipe, restores the root's mode if it had to change, and measures what was freed.
    fn finish(mut self) -> Result<FsWipeStats, FsWipeError> {
        let result = self.run();
        // Close every stream before measuring or reporting.
        self.stack.truncate(1);
        let restored = if self.root_mode_changed {
            fchmod(&self.root_fd, Mode::from_raw_mode(self.root_mode & 0o7777)).map_err(|e| self.io_root("chmod", e))
        } else {
            Ok(())
        };
        result?;
        restored?;
        self.reset_root()?;
        let used_after = used_bytes(self.root_fd.as_fd()).map_err(|e| self.io_root("statfs", e))?;
        let mut stats = self.stats;
        stats.bytes_freed = self.used_before.saturating_sub(used_after);
        tracing::debug!(
            path = %self.root.display(),
            files = stats.files,
            dirs = stats.dirs,
            bytes_freed = stats.bytes_freed,
            "wiped filesystem volume"
        );
        Ok(stats)
    }

    /// Leaves the (now empty) root as a new volume's, on the descriptor the walk started from:
    /// first the inode flags (an immutable root would refuse the rest), then the extended
    /// attributes, the owner (which clears set-id bits) and the mode; then flushes it.
    fn reset_root(&self) -> Result<(), FsWipeError> {
        let fd = self.root_fd.as_fd();
        let failed = |what: String, e: Errno| FsWipeError::RootMetadata {
            path: self.root.to_path_buf(),
            what,
            detail: std::io::Error::from(e).to_string(),
        };
        match ioctl_getflags(fd) {
            Ok(current) => match plan_flags(current.bits()) {
                FlagsPlan::Keep => {}
                FlagsPlan::Set(wanted) => {
                    let what = format!("inode flags {} (chattr)", flag_names(current.bits() & !wanted));
                    rustix::fs::ioctl_setflags(fd, IFlags::from_bits_retain(wanted)).map_err(|e| failed(what, e))?;
                }
                FlagsPlan::Refuse { flags } => {
                    return Err(FsWipeError::RootMetadata {
                        path: self.root.to_path_buf(),
                        what: format!("inode flags {} (chattr)", flag_names(flags)),
                        detail: "an encryption policy or verity cannot be taken off a directory that stays; \
                                 make the filesystem anew"
                            .into(),
                    });
                }
            },
            // No inode flags on this filesystem.
            Err(Errno::NOTTY | Errno::OPNOTSUPP | Errno::NOSYS | Errno::INVAL) => {}
            Err(e) => return Err(failed("inode flags (chattr)".into(), e)),
        }
        for name in list_xattrs(fd).map_err(|e| failed("extended attributes".into(), e))? {
            if !removes_xattr(name.to_bytes()) {
                continue;
            }
            match rustix::fs::fremovexattr(fd, name.as_c_str()) {
                Ok(()) | Err(Errno::NODATA) => {}
                Err(e) => {
                    return Err(failed(format!("extended attribute {}", name.to_string_lossy()), e));
                }
            }
        }
        let st = fstat(fd).map_err(|e| self.io_root("stat", e))?;
        #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
        let current = RootOwnership { mode: st.st_mode as u32, uid: st.st_uid, gid: st.st_gid };
        let plan =
            plan_ownership(current, target_ownership(self.configured_root, read_root_record(fd), self.fresh_root));
        if let Some((uid, gid)) = plan.chown {
            let (u, g) = (rustix::fs::Uid::from_raw_unchecked(uid), rustix::fs::Gid::from_raw_unchecked(gid));
            rustix::fs::fchown(fd, Some(u), Some(g))
                .map_err(|e| failed(format!("owner {}:{} (to {uid}:{gid})", current.uid, current.gid), e))?;
        }
        if let Some(mode) = plan.chmod {
            fchmod(fd, Mode::from_raw_mode(mode))
                .map_err(|e| failed(format!("mode {:04o} (to {mode:04o})", current.mode & 0o7777), e))?;
        }
        rustix::fs::fsync(fd).map_err(|e| self.io_root("fsync", e))
    }

    /// The walk: read the current directory; descend into subdirectories, unlink the rest,
    /// and remove a directory from its parent once it reads empty.
    fn run(&mut self) -> Result<(), FsWipeError> {
        loop {
            self.tick()?;
            let top = self.stack.len() - 1;
            let next = match self.stack[top].stream.as_mut() {
                Some(stream) => stream.next(),
                None => Err(Errno::BADF),
            };
            match next {
                Err(e) => return Err(self.io("readdir", top, None, e)),
                Ok(Some((name, d_type))) => {
                    if matches!(name.to_bytes(), b"." | b"..") {
                        continue;
                    }
                    self.stack[top].dirty = true;
                    self.entry(top, &name, d_type)?;
                }
                Ok(None) if top == 0 => {
                    // Read the root once more: only a pass that finds nothing ends the wipe,
                    // so entries created during the walk are not left behind silently.
                    if !self.stack[0].dirty {
                        return Ok(());
                    }
                    self.rescan(0, MAX_RESCANS + 1)?;
                }
                Ok(None) => self.leave(top)?,
            }
        }
    }

    fn tick(&mut self) -> Result<(), FsWipeError> {
        self.since_cancel_check += 1;
        if self.since_cancel_check >= CANCEL_EVERY {
            self.since_cancel_check = 0;
            if let Some(beats) = self.beats {
                beats.fetch_add(u64::from(CANCEL_EVERY), Ordering::Relaxed);
            }
            if self.cancel.load(Ordering::Relaxed) {
                return Err(FsWipeError::Cancelled { path: self.root.to_path_buf() });
            }
        }
        Ok(())
    }

    /// Removes entry `name` of directory `parent` (the top frame), descending if it is one.
    fn entry(&mut self, parent: usize, name: &CStr, d_type: FileType) -> Result<(), FsWipeError> {
        let mut is_dir = match d_type {
            FileType::Directory => true,
            FileType::Unknown => match self.stat_is_dir(parent, name) {
                Ok(is_dir) => is_dir,
                Err(Errno::NOENT) => return Ok(()),
                Err(e) => return Err(self.io("stat", parent, Some(name), e)),
            },
            _ => false,
        };
        for _ in 0..=MAX_TYPE_FLIPS {
            if is_dir {
                match self.open_child(parent, name) {
                    Ok(fd) => return self.descend(parent, name, fd),
                    // Not (or no longer) a directory: a symlink gives ELOOP and is never followed.
                    Err(Errno::LOOP | Errno::NOTDIR) => is_dir = false,
                    Err(Errno::NOENT) => return Ok(()),
                    Err(e) => return Err(self.io("open", parent, Some(name), e)),
                }
            } else {
                match self.remove(parent, name, false)? {
                    Ok(()) => {
                        self.stats.files += 1;
                        return Ok(());
                    }
                    // Became a directory since readdir.
                    Err(Errno::ISDIR) => is_dir = true,
                    Err(Errno::NOENT) => return Ok(()),
                    Err(e) => return Err(self.io("unlink", parent, Some(name), e)),
                }
            }
        }
        Err(FsWipeError::TreeChanged {
            path: self.path(parent, Some(name)),
            detail: "it keeps switching between a directory and a non-directory".into(),
        })
    }

    /// The descriptor of directory `idx` (EBADF if its stream is closed, which the walk avoids).
    fn dir_fd(&self, idx: usize) -> Result<BorrowedFd<'_>, Errno> {
        self.stack[idx].stream.as_ref().ok_or(Errno::BADF).and_then(DirStream::fd)
    }

    /// For a DT_UNKNOWN entry (some filesystems): whether it is a directory, never following.
    fn stat_is_dir(&mut self, parent: usize, name: &CStr) -> Result<bool, Errno> {
        let mut st = statat(self.dir_fd(parent)?, name, AtFlags::SYMLINK_NOFOLLOW);
        if matches!(st, Err(Errno::ACCESS)) && self.fix_perms(parent) {
            st = statat(self.dir_fd(parent)?, name, AtFlags::SYMLINK_NOFOLLOW);
        }
        Ok(FileType::from_raw_mode(st?.st_mode) == FileType::Directory)
    }

    /// Opens subdirectory `name` of `parent` without following symlinks; on a permission error
    /// gives the parent u+rwx and the child 0o700, then tries once more.
    fn open_child(&mut self, parent: usize, name: &CStr) -> Result<OwnedFd, Errno> {
        match openat(self.dir_fd(parent)?, name, DIR_FLAGS, Mode::empty()) {
            Err(Errno::ACCESS | Errno::PERM) => {
                self.fix_perms(parent);
                let dir = self.dir_fd(parent)?;
                chmod_owner_only_nofollow(dir, name);
                openat(dir, name, DIR_FLAGS, Mode::empty())
            }
            other => other,
        }
    }

    /// Enters the just-opened subdirectory, unless it is on another mount.
    fn descend(&mut self, parent: usize, name: &CStr, fd: OwnedFd) -> Result<(), FsWipeError> {
        let info = dir_info(fd.as_fd()).map_err(|e| self.io("stat", parent, Some(name), e))?;
        let other_mount = info.dev != self.root_dev
            || matches!((info.mnt_id, self.root_mnt_id), (Some(a), Some(b)) if a != b)
            || info.mount_root == Some(true);
        if other_mount {
            return Err(FsWipeError::NestedMount { path: self.path(parent, Some(name)) });
        }
        let stream = DirStream::new(fd).map_err(|e| self.io("opendir", parent, Some(name), e))?;
        self.make_room();
        self.stack.push(Frame {
            name: name.to_owned(),
            dev: info.dev,
            ino: info.ino,
            mode: info.mode,
            stream: Some(stream),
            perms_fixed: false,
            rescans: 0,
            dirty: false,
        });
        self.open_streams += 1;
        Ok(())
    }

    /// Closes the oldest open stream (never the root's nor the top's) when at the limit.
    fn make_room(&mut self) {
        let top = self.stack.len() - 1;
        if self.open_streams >= self.max_open_streams && self.first_open < top {
            self.stack[self.first_open].stream = None;
            self.first_open += 1;
            self.open_streams -= 1;
        }
    }

    /// The top directory reads empty: remove it from its parent, or re-read it if something
    /// was created in it meanwhile.
    fn leave(&mut self, top: usize) -> Result<(), FsWipeError> {
        let parent = top - 1;
        if self.stack[parent].stream.is_none() {
            self.reopen_parent(top)?;
        }
        let name = self.stack[top].name.clone();
        match self.remove(parent, &name, true)? {
            Ok(()) => {
                self.stats.dirs += 1;
                self.pop();
            }
            Err(Errno::NOENT) => self.pop(),
            Err(Errno::NOTEMPTY | Errno::EXIST) => self.rescan(top, MAX_RESCANS)?,
            Err(e) => return Err(self.io("rmdir", parent, Some(&name), e)),
        }
        Ok(())
    }

    fn pop(&mut self) {
        self.stack.pop();
        self.open_streams = self.open_streams.saturating_sub(1);
        self.first_open = self.first_open.min(self.stack.len());
    }

    /// Reads frame `idx` again from the start, at most `limit` times.
    fn rescan(&mut self, idx: usize, limit: u32) -> Result<(), FsWipeError> {
        self.stack[idx].rescans += 1;
        if self.stack[idx].rescans > limit {
            return Err(FsWipeError::TreeChanged {
                path: self.path(idx, None),
                detail: format!("entries keep appearing in it (read {limit} times)"),
            });
        }
        let frame = &mut self.stack[idx];
        frame.dirty = false;
        if let Some(stream) = frame.stream.as_mut() {
            stream.rewind();
        }
        Ok(())
    }

    /// Reopens the closed parent of the top frame through `..` and checks it is the same
    /// directory as when first entered (it was not moved meanwhile).
    fn reopen_parent(&mut self, top: usize) -> Result<(), FsWipeError> {
        let parent = top - 1;
        let fd = self
            .dir_fd(top)
            .and_then(|child| openat(child, c"..", DIR_FLAGS, Mode::empty()))
            .map_err(|e| self.io("open", parent, None, e))?;
        let info = dir_info(fd.as_fd()).map_err(|e| self.io("stat", parent, None, e))?;
        let frame = &self.stack[parent];
        if (info.dev, info.ino) != (frame.dev, frame.ino) {
            return Err(FsWipeError::TreeChanged {
                path: self.path(parent, None),
                detail: format!(
                    "reopened through .. it is inode {}:{} instead of {}:{} (moved during the wipe)",
                    info.dev, info.ino, frame.dev, frame.ino
                ),
            });
        }
        let stream = DirStream::new(fd).map_err(|e| self.io("opendir", parent, None, e))?;
        self.stack[parent].stream = Some(stream);
        self.open_streams += 1;
        self.first_open = self.first_open.min(parent);
        Ok(())
    }

    /// Unlinks (or rmdirs) `name` in directory `parent`. Permission errors get one retry after
    /// giving the directory u+rwx; immutable or append-only entries become `Immutable`. Other
    /// errors come back as the inner `Err` for the caller to interpret.
    fn remove(&mut self, parent: usize, name: &CStr, dir: bool) -> Result<Result<(), Errno>, FsWipeError> {
        let flag = if dir { AtFlags::REMOVEDIR } else { AtFlags::empty() };
        let unlink = |w: &Self| w.dir_fd(parent).and_then(|fd| unlinkat(fd, name, flag));
        let err = match unlink(self) {
            Err(e @ (Errno::ACCESS | Errno::PERM)) => e,
            other => return Ok(other),
        };
        // Root gets EPERM only for flags no permission change can help with: report at once.
        if err == Errno::PERM && self.dir_fd(parent).is_ok_and(|fd| entry_forbids_unlink(fd, name)) {
            return Err(FsWipeError::Immutable { path: self.path(parent, Some(name)) });
        }
        let err = if self.fix_perms(parent) {
            match unlink(self) {
                Err(e @ (Errno::ACCESS | Errno::PERM)) => e,
                other => return Ok(other),
            }
        } else {
            err
        };
        let dir_fd = self.dir_fd(parent);
        if dir_fd.is_ok_and(|fd| entry_forbids_unlink(fd, name)) {
            return Err(FsWipeError::Immutable { path: self.path(parent, Some(name)) });
        }
        if dir_fd.is_ok_and(flags_forbid_unlink) {
            return Err(FsWipeError::Immutable { path: self.path(parent, None) });
        }
        Ok(Err(err))
    }

    /// Adds u+rwx to directory `idx` once; returns whether its mode changed now.
    fn fix_perms(&mut self, idx: usize) -> bool {
        let frame = &mut self.stack[idx];
        if frame.perms_fixed || frame.mode & 0o700 == 0o700 {
            return false;
        }
        frame.perms_fixed = true;
        let Some(Ok(fd)) = frame.stream.as_ref().map(DirStream::fd) else { return false };
        let changed = fchmod(fd, Mode::from_raw_mode((frame.mode | 0o700) & 0o7777)).is_ok();
        if changed && idx == 0 {
            self.root_mode_changed = true;
        }
        changed
    }

    /// Full path of frame `idx`, or of its entry `child`, for error messages.
    fn path(&self, idx: usize, child: Option<&CStr>) -> PathBuf {
        let mut path = self.root.to_path_buf();
        for frame in self.stack.iter().take(idx + 1).skip(1) {
            path.push(OsStr::from_bytes(frame.name.to_bytes()));
        }
        if let Some(child) = child {
            path.push(OsStr::from_bytes(child.to_bytes()));
        }
        path
    }

    fn io(&self, op: &'static str, idx: usize, child: Option<&CStr>, e: Errno) -> FsWipeError {
        FsWipeError::Io(crate::host::HostError::io(op, self.path(idx, child), e))
    }

    fn io_root(&self, op: &'static str, e: Errno) -> FsWipeError {
        FsWipeError::Io(crate::host::HostError::io(op, self.root, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::test_env::{cannot_run, require_root};
    use std::ffi::OsString;
    use std::fs;
    use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
    use std::process::Command;

    fn run(cmd: &mut Command) {
        let status = cmd.status().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
        assert!(status.success(), "{cmd:?}: {status}");
    }

    /// A mount made by a test, lazily unmounted on drop.
    struct Mount(PathBuf);

    impl Drop for Mount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }

    fn tmpfs(path: &Path, size_mib: u64) -> Mount {
        fs::create_dir_all(path).unwrap();
        run(Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"]).arg(path));
        Mount(path.to_path_buf())
    }

    fn bind(src: &Path, dst: &Path) -> Mount {
        fs::create_dir_all(dst).unwrap();
        run(Command::new("mount").arg("--bind").arg(src).arg(dst));
        Mount(dst.to_path_buf())
    }

    /// A temporary directory and its canonical path (mount points are canonical in the table).
    fn scratch() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let base = fs::canonicalize(dir.path()).unwrap();
        (dir, base)
    }

    fn entries(dir: &Path) -> Vec<OsString> {
        fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name()).collect()
    }

    fn wipe(root: &Path) -> Result<FsWipeStats, FsWipeError> {
        wipe_filesystem(root, &MountTable::read().unwrap(), &AtomicBool::new(false))
    }

    #[test]
    fn wipes_everything_below_root_and_never_follows_symlinks() {
        if !require_root("wipes_everything_below_root_and_never_follows_symlinks") {
            return;
        }
        let (_tmp, base) = scratch();
        let outside = base.join("outside");
        fs::create_dir_all(outside.join("dir")).unwrap();
        fs::write(outside.join("file.txt"), "keep").unwrap();
        fs::write(outside.join("dir/inner.txt"), "keep too").unwrap();
        let vol = base.join("vol");
        let _m = tmpfs(&vol, 64);

        fs::create_dir_all(vol.join("a/b/c")).unwrap();
        fs::write(vol.join("a/b/c/file.txt"), "x").unwrap();
        fs::write(vol.join("big.bin"), vec![7u8; 1 << 20]).unwrap();
        fs::write(vol.join("readonly.txt"), "r").unwrap();
        fs::set_permissions(vol.join("readonly.txt"), fs::Permissions::from_mode(0o444)).unwrap();
        fs::create_dir(vol.join("ro_dir")).unwrap();
        fs::write(vol.join("ro_dir/f"), "f").unwrap();
        fs::set_permissions(vol.join("ro_dir"), fs::Permissions::from_mode(0o555)).unwrap();
        fs::create_dir_all(vol.join("locked/sub")).unwrap();
        fs::write(vol.join("locked/sub/f"), "f").unwrap();
        fs::set_permissions(vol.join("locked/sub"), fs::Permissions::from_mode(0o000)).unwrap();
        fs::set_permissions(vol.join("locked"), fs::Permissions::from_mode(0o000)).unwrap();
        let odd_dir = vol.join(OsStr::from_bytes(b"\xff\xfe"));
        fs::create_dir(&odd_dir).unwrap();
        fs::write(odd_dir.join(OsStr::from_bytes(b"\xfe\nx")), "odd").unwrap();
        fs::write(vol.join("line\nbreak"), "nl").unwrap();
        fs::write(vol.join(".hidden"), "h").unwrap();
        rustix::fs::mknodat(CWD, vol.join("fifo"), FileType::Fifo, Mode::from_raw_mode(0o644), 0).unwrap();
        symlink(outside.join("file.txt"), vol.join("link_out_file")).unwrap();
        symlink(outside.join("dir"), vol.join("link_out_dir")).unwrap();
        symlink("../outside/dir", vol.join("link_up_relative")).unwrap();
        symlink(vol.join("a/b/c/file.txt"), vol.join("link_in")).unwrap();
        symlink("/nonexistent/target", vol.join("dangling")).unwrap();
        fs::set_permissions(&vol, fs::Permissions::from_mode(0o751)).unwrap();
        std::os::unix::fs::chown(&vol, Some(1234), Some(5678)).unwrap();

        let stats = wipe(&vol).unwrap();
        assert_eq!(entries(&vol), Vec::<OsString>::new());
        // big.bin readonly.txt file.txt ro_dir/f locked/sub/f odd line\nbreak .hidden fifo + 5 links
        assert_eq!(stats.files, 14, "{stats:?}");
        // a a/b a/b/c ro_dir locked locked/sub \xff\xfe
        assert_eq!(stats.dirs, 7, "{stats:?}");
        assert!(stats.bytes_freed >= 1 << 20, "{stats:?}");
        // The root is a new tmpfs root again (core::wipe::volume_root), not the last tenant's.
        let meta = fs::metadata(&vol).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o1777);
        assert_eq!((meta.uid(), meta.gid()), (0, 0));
        assert_eq!(fs::read_to_string(outside.join("file.txt")).unwrap(), "keep");
        assert_eq!(fs::read_to_string(outside.join("dir/inner.txt")).unwrap(), "keep too");
        assert_eq!(entries(&outside.join("dir")).len(), 1);
    }

    #[test]
    fn unprivileged_wipe_fixes_permissions_and_cannot_give_the_root_away() {
        if !require_root("unprivileged_wipe_fixes_permissions_and_cannot_give_the_root_away") {
            return;
        }
        let (_tmp, base) = scratch();
        let vol = base.join("vol");
        let _m = tmpfs(&vol, 16);
        fs::create_dir_all(vol.join("plain")).unwrap();
        fs::write(vol.join("plain/f"), "f").unwrap();
        fs::create_dir_all(vol.join("ro_dir")).unwrap();
        fs::write(vol.join("ro_dir/f"), "f").unwrap();
        fs::create_dir_all(vol.join("locked/sub")).unwrap();
        fs::write(vol.join("locked/sub/f"), "f").unwrap();
        fs::create_dir_all(vol.join("noexec")).unwrap();
        fs::write(vol.join("noexec/f"), "f").unwrap();
        fs::write(vol.join("rofile"), "r").unwrap();
        run(Command::new("chown").args(["-R", "1000:1000"]).arg(&vol));
        for (rel, mode) in [("rofile", 0o400), ("ro_dir", 0o555), ("locked/sub", 0o000), ("locked", 0o000)] {
            fs::set_permissions(vol.join(rel), fs::Permissions::from_mode(mode)).unwrap();
        }
        fs::set_permissions(vol.join("noexec"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::set_permissions(&vol, fs::Permissions::from_mode(0o551)).unwrap();
        let table = MountTable::read().unwrap();

        // The filesystem uid is per thread and drops root's DAC capabilities with it.
        let thread_vol = vol.clone();
        let result = std::thread::spawn(move || {
            nix::unistd::setfsgid(nix::unistd::Gid::from_raw(1000));
            nix::unistd::setfsuid(nix::unistd::Uid::from_raw(1000));
            assert_eq!(
                fs::read_dir(thread_vol.join("locked")).unwrap_err().kind(),
                std::io::ErrorKind::PermissionDenied,
                "the thread should not bypass permissions"
            );
            wipe_filesystem(&thread_vol, &table, &AtomicBool::new(false))
        })
        .join()
        .unwrap();
        // Everything below the root is gone, and the root's mode changed for the walk is put
        // back; but a fresh tmpfs root is root's, and uid 1000 cannot give it away: the wipe
        // says so (the volume is not offered as the last tenant's).
        let err = result.unwrap_err();
        assert_eq!(entries(&vol), Vec::<OsString>::new());
        assert!(
            matches!(&err, FsWipeError::RootMetadata { path, what, .. } if *path == vol && what.contains("owner 1000:1000")),
            "{err}"
        );
        assert!(err.to_string().contains(&vol.display().to_string()), "{err}");
        let meta = fs::metadata(&vol).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o551);
        assert_eq!((meta.uid(), meta.gid()), (1000, 1000));
        // Root then makes it a new volume's root.
        wipe(&vol).unwrap();
        let meta = fs::metadata(&vol).unwrap();
        assert_eq!((meta.mode() & 0o7777, meta.uid(), meta.gid()), (0o1777, 0, 0));
    }

    /// Builds `depth` nested directories `d` below `dir` with a file every `file_every` levels,
    /// relative to descriptors (the path is longer than PATH_MAX).
    fn deep_chain(dir: &Path, depth: usize, file_every: usize) -> u64 {
        let mut fd = openat(CWD, dir, DIR_FLAGS, Mode::empty()).unwrap();
        let mut files = 0;
        for level in 1..=depth {
            rustix::fs::mkdirat(&fd, "d", Mode::RWXU).unwrap();
            fd = openat(&fd, "d", DIR_FLAGS, Mode::empty()).unwrap();
            if level % file_every == 0 {
                let flags = OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC;
                drop(openat(&fd, "f", flags, Mode::RUSR).unwrap());
                files += 1;
            }
        }
        files
    }

    #[test]
    fn deep_tree_bounded_descriptors() {
        if !require_root("deep_tree_bounded_descriptors") {
            return;
        }
        let (_tmp, base) = scratch();
        let vol = base.join("vol");
        let _m = tmpfs(&vol, 64);
        let files = deep_chain(&vol, 3000, 100);
        let stats = wipe(&vol).unwrap();
        assert_eq!((stats.files, stats.dirs), (files, 3000));
        assert_eq!(entries(&vol), Vec::<OsString>::new());
    }

    #[test]
    fn reopening_closed_levels_through_dotdot_is_complete() {
        if !require_root("reopening_closed_levels_through_dotdot_is_complete") {
            return;
        }
        let (_tmp, base) = scratch();
        let vol = base.join("vol");
        let _m = tmpfs(&vol, 16);
        // Every level has files and two subdirectories, so closed levels are re-read after
        // part of them is already gone.
        let mut dir = vol.clone();
        let mut want = FsWipeStats::default();
        for level in 0..20 {
            for i in 0..5 {
                fs::write(dir.join(format!("f{i}")), "x").unwrap();
            }
            fs::create_dir(dir.join("side")).unwrap();
            fs::write(dir.join("side/f"), "x").unwrap();
            fs::create_dir(dir.join(format!("l{level}"))).unwrap();
            want.files += 6;
            want.dirs += 2;
            dir = dir.join(format!("l{level}"));
        }
        let cancel = AtomicBool::new(false);
        let table = MountTable::read().unwrap();
        let mut w = Wiper::open(&vol, &table, &cancel).unwrap();
        w.max_open_streams = 3;
        let stats = w.finish().unwrap();
        assert_eq!((stats.files, stats.dirs), (want.files, want.dirs));
        assert_eq!(entries(&vol), Vec::<OsString>::new());
    }

    #[test]
    fn huge_directory() {
        if !require_root("huge_directory") {
            return;
        }
        let (_tmp, base) = scratch();
        let vol = base.join("vol");
        let _m = tmpfs(&vol, 256);
        fs::create_dir(vol.join("big")).unwrap();
        for i in 0..20_000 {
            fs::write(vol.join(format!("big/file-{i:05}")), "").unwrap();
        }
        let start = std::time::Instant::now();
        let stats = wipe(&vol).unwrap();
        println!("huge_directory: 20000 files in {:?}", start.elapsed());
        assert_eq!((stats.files, stats.dirs), (20_000, 1));
        assert_eq!(entries(&vol), Vec::<OsString>::new());
    }

    #[test]
    fn nested_mount_in_table_is_refused_before_anything_is_removed() {
        if !require_root("nested_mount_in_table_is_refused_before_anything_is_removed") {
            return;
        }
        let (_tmp, base) = scratch();
        let vol = base.join("vol");
        let _m = tmpfs(&vol, 16);
        fs::write(vol.join("mine.txt"), "x").unwrap();
        let nested = vol.join("sub/nested");
        let _n = tmpfs(&nested, 16);
        fs::write(nested.join("keep.txt"), "keep").unwrap();
        let err = wipe(&vol).unwrap_err();
        assert!(matches!(&err, FsWipeError::NestedMount { path } if *path == nested), "{err}");
        assert!(err.to_string().contains(&nested.display().to_string()), "{err}");
        assert!(vol.join("mine.txt").exists());
        assert_eq!(fs::read_to_string(nested.join("keep.txt")).unwrap(), "keep");
    }

    #[test]
    fn nested_mount_after_table_read_is_caught_by_device() {
        if !require_root("nested_mount_after_table_read_is_caught_by_device") {
            return;
        }
        let (_tmp, base) = scratch();
        let vol = base.join("vol");
        let _m = tmpfs(&vol, 16);
        fs::create_dir_all(vol.join("sub")).unwrap();
        let stale = MountTable::read().unwrap();
        let nested = vol.join("sub/nested");
        let _n = tmpfs(&nested, 16);
        fs::write(nested.join("keep.txt"), "keep").unwrap();
        let err = wipe_filesystem(&vol, &stale, &AtomicBool::new(false)).unwrap_err();
        assert!(matches!(&err, FsWipeError::NestedMount { path } if *path == nested), "{err}");
        assert_eq!(fs::read_to_string(nested.join("keep.txt")).unwrap(), "keep");
    }

    #[test]
    fn bind_mount_of_same_filesystem_is_caught_by_mount_id() {
        if !require_root("bind_mount_of_same_filesystem_is_caught_by_mount_id") {
            return;
        }
        let (_tmp, base) = scratch();
        let disk = base.join("disk");
        let _d = tmpfs(&disk, 16);
        fs::create_dir_all(disk.join("vol/sub")).unwrap();
        fs::create_dir_all(disk.join("outside")).unwrap();
        fs::write(disk.join("outside/keep.txt"), "keep").unwrap();
        let vol = base.join("vol");
        let _v = bind(&disk.join("vol"), &vol);
        let stale = MountTable::read().unwrap();
        // Same st_dev as the volume: only the mount ID tells them apart.
        let evil = vol.join("sub/evil");
        let _e = bind(&disk.join("outside"), &evil);
        let err = wipe_filesystem(&vol, &stale, &AtomicBool::new(false)).unwrap_err();
        assert!(matches!(&err, FsWipeError::NestedMount { path } if *path == evil), "{err}");
        assert_eq!(fs::read_to_string(disk.join("outside/keep.txt")).unwrap(), "keep");
    }

    #[test]
    fn not_a_mount_point_is_refused() {
        if !require_root("not_a_mount_point_is_refused") {
            return;
        }
        let (_tmp, base) = scratch();
        let plain = base.join("plain");
        fs::create_dir(&plain).unwrap();
        fs::write(plain.join("keep.txt"), "keep").unwrap();
        let err = wipe(&plain).unwrap_err();
        assert!(matches!(&err, FsWipeError::NotMounted { path } if *path == plain), "{err}");
        assert!(err.to_string().contains(&plain.display().to_string()), "{err}");

        // A table that wrongly claims it is a mount point: the kernel's word wins.
        let fake = MountTable::parse(&format!("999 1 0:999 / {} rw - tmpfs tmpfs rw\n", plain.display())).unwrap();
        let err = wipe_filesystem(&plain, &fake, &AtomicBool::new(false)).unwrap_err();
        assert!(matches!(&err, FsWipeError::NotMounted { .. }), "{err}");

        // A subdirectory of a volume is not the volume.
        let vol = base.join("vol");
        let _m = tmpfs(&vol, 16);
        fs::create_dir(vol.join("sub")).unwrap();
        fs::write(vol.join("sub/keep.txt"), "keep").unwrap();
        let err = wipe(&vol.join("sub")).unwrap_err();
        assert!(matches!(&err, FsWipeError::NotMounted { .. }), "{err}");

        // The right path with another mount's ID: the table is stale.
        let stale = MountTable::parse(&format!("999999 1 0:999 / {} rw - tmpfs tmpfs rw\n", vol.display())).unwrap();
        let err = wipe_filesystem(&vol, &stale, &AtomicBool::new(false)).unwrap_err();
        assert!(matches!(&err, FsWipeError::TreeChanged { .. }), "{err}");

        assert!(plain.join("keep.txt").exists());
        assert!(vol.join("sub/keep.txt").exists());
    }

    #[test]
    fn cancel_flag_stops_the_wipe() {
        if !require_root("cancel_flag_stops_the_wipe") {
            return;
        }
        let (_tmp, base) = scratch();
        let vol = base.join("vol");
        let _m = tmpfs(&vol, 16);
        fs::write(vol.join("keep.txt"), "keep").unwrap();
        let err = wipe_filesystem(&vol, &MountTable::read().unwrap(), &AtomicBool::new(true)).unwrap_err();
        assert!(matches!(&err, FsWipeError::Cancelled { path } if *path == vol), "{err}");
        assert!(vol.join("keep.txt").exists());
    }

    #[test]
    fn entries_that_change_type_after_readdir_are_never_followed() {
        if !require_root("entries_that_change_type_after_readdir_are_never_followed") {
            return;
        }
        let (_tmp, base) = scratch();
        let outside = base.join("outside");
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("keep.txt"), "keep").unwrap();
        let vol = base.join("vol");
        let _m = tmpfs(&vol, 16);
        symlink(&outside, vol.join("was_dir")).unwrap();
        fs::write(vol.join("was_dir_now_file"), "x").unwrap();
        fs::create_dir(vol.join("was_file")).unwrap();
        fs::write(vol.join("was_file/f"), "x").unwrap();
        let table = MountTable::read().unwrap();
        let cancel = AtomicBool::new(false);
        let mut w = Wiper::open(&vol, &table, &cancel).unwrap();
        // As if readdir had seen directories where there now are a symlink and a file.
        w.entry(0, c"was_dir", FileType::Directory).unwrap();
        w.entry(0, c"was_dir_now_file", FileType::Directory).unwrap();
        assert_eq!(w.stats.files, 2);
        // As if readdir had seen a file where there now is a directory.
        w.entry(0, c"was_file", FileType::RegularFile).unwrap();
        assert_eq!(w.stack.len(), 2, "descended into the directory");
        w.run().unwrap();
        // Filesystems without d_type: the type comes from fstatat, never following.
        symlink(&outside, vol.join("unknown_link")).unwrap();
        fs::create_dir(vol.join("unknown_dir")).unwrap();
        w.stack[0].stream.as_mut().unwrap().rewind();
        w.entry(0, c"unknown_link", FileType::Unknown).unwrap();
        w.entry(0, c"unknown_dir", FileType::Unknown).unwrap();
        assert_eq!(w.stack.len(), 2, "descended into the directory");
        let stats = w.finish().unwrap();
        assert_eq!((stats.files, stats.dirs), (4, 2));
        assert_eq!(entries(&vol), Vec::<OsString>::new());
        assert_eq!(fs::read_to_string(outside.join("keep.txt")).unwrap(), "keep");
    }

    /// A loop device with ext4, for filesystems flags tmpfs may not support.
    struct Ext4 {
        device: String,
    }

    impl Drop for Ext4 {
        fn drop(&mut self) {
            let _ = Command::new("losetup").arg("-d").arg(&self.device).status();
        }
    }

    fn ext4(base: &Path, vol: &Path) -> (Ext4, Mount) {
        let image = base.join("disk.img");
        run(Command::new("truncate").arg("-s").arg("32M").arg(&image));
        let out = Command::new("losetup").args(["--find", "--show"]).arg(&image).output().unwrap();
        assert!(out.status.success());
        let device = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let dev = Ext4 { device: device.clone() };
        run(Command::new("mkfs.ext4").args(["-q", &device]));
        fs::create_dir_all(vol).unwrap();
        run(Command::new("mount").arg(&device).arg(vol));
        (dev, Mount(vol.to_path_buf()))
    }

    fn chattr(flag: &str, path: &Path) -> bool {
        Command::new("chattr").arg(flag).arg(path).status().is_ok_and(|s| s.success())
    }

    #[test]
    fn immutable_and_append_only_entries_are_reported() {
        if !require_root("immutable_and_append_only_entries_are_reported") {
            return;
        }
        if Command::new("chattr").arg("--help").output().is_err() {
            cannot_run("immutable_and_append_only_entries_are_reported", "no chattr (e2fsprogs)");
            return;
        }
        let (_tmp, base) = scratch();
        let vol = base.join("vol");
        let mut _mounts = (None, tmpfs(&vol, 16));
        fs::write(vol.join("probe"), "x").unwrap();
        if chattr("+i", &vol.join("probe")) {
            assert!(chattr("-i", &vol.join("probe")));
        } else {
            drop(_mounts);
            let (dev, mount) = ext4(&base, &vol);
            _mounts = (Some(dev), mount);
        }
        fs::create_dir_all(vol.join("dir")).unwrap();
        let locked = vol.join("dir/locked.txt");
        fs::write(&locked, "x").unwrap();
        assert!(chattr("+i", &locked));
        let err = wipe(&vol).unwrap_err();
        assert!(matches!(&err, FsWipeError::Immutable { path } if *path == locked), "{err}");
        assert!(err.to_string().contains(&locked.display().to_string()), "{err}");
        assert!(chattr("-i", &locked));

        let append = vol.join("append");
        fs::create_dir_all(&append).unwrap();
        fs::write(append.join("f"), "x").unwrap();
        assert!(chattr("+a", &append));
        let err = wipe(&vol).unwrap_err();
        assert!(matches!(&err, FsWipeError::Immutable { path } if *path == append), "{err}");
        assert!(chattr("-a", &append));

        wipe(&vol).unwrap();
        assert_eq!(entries(&vol), Vec::<OsString>::new());
    }
}

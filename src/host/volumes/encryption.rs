//! The host half of per-volume encryption (core::volumes::encryption): readying an encrypted volume's
//! data directory with a fresh key, having its key in the kernel (after a reboot or a remount
//! the kernel has none), and destroying it. Every call works on a descriptor of the volume's
//! root the caller opened (host::identity::used_mark::open_volume_root: no symlink followed, nothing
//! mounted over it), and on the data directory opened from it without following a link, so a
//! path swapped meanwhile cannot redirect it.

use std::os::fd::{AsFd as _, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags};

use crate::core::volumes::encryption::ENCRYPTED_DIR;
use crate::host::volumes::fscrypt::{self, FscryptError, KeyId, KeyStatus, MasterKey, Removal, Support};
use crate::host::volumes::key_store::{KeyStore, KeyStoreError};

/// Why an encryption step failed, naming the volume.
#[derive(Debug, thiserror::Error)]
pub enum EncryptionError {
    /// The volume's filesystem cannot take an fscrypt policy.
    #[error("{path}: {why}")]
    Unsupported { path: PathBuf, why: String },
    /// An fscrypt call failed (its error names the path).
    #[error(transparent)]
    Fscrypt(#[from] FscryptError),
    /// The node's key store failed.
    #[error("{path}: {source}")]
    Store {
        path: PathBuf,
        #[source]
        source: KeyStoreError,
    },
    /// A file operation on the data directory failed (the host's one I/O error: which operation, which file).
    #[error(transparent)]
    Io(#[from] crate::host::HostError),
    /// The data directory holds files of an earlier volume (its key unknown or its PV gone):
    /// never handed to a new claim, and never emptied here (the wipe does that, proven).
    #[error(
        "{path} already holds files (an earlier volume's data, encrypted with {key}); the volume is not published until that data is gone: remove the directory's contents on the node (they cannot be read without the key), or reformat the disk"
    )]
    HoldsData { path: PathBuf, key: String },
    /// The data directory is empty and encrypted with a stored key made for another disk (a
    /// cloned or restored disk): two volumes must never share a key.
    #[error(
        "{path} is encrypted with the stored key {key}, made for another disk ({made_for}); not reused (a cloned disk?): remove the empty directory on the node to have a new key made"
    )]
    OtherDisksKey { path: PathBuf, key: String, made_for: String },
    /// Something is mounted on the data directory: it is not this volume's directory.
    #[error("{path} is a mount point (another filesystem mounted on it): not this volume's data directory")]
    MountedOver { path: PathBuf },
    /// The data directory is not encrypted with the key its PV names.
    #[error("{path} is encrypted with {found}, not with the key its PV names ({wanted}): not the directory published")]
    WrongKey { path: PathBuf, found: String, wanted: String },
    /// The kernel gave another identifier for the stored key than its name.
    #[error("{path}: the stored key {wanted} is another key (the kernel derives {found} from it); refused")]
    KeyMismatch { path: PathBuf, found: String, wanted: String },
    /// The kernel still has the key after its removal.
    #[error("{path}: the key {key} is still in the kernel after its removal ({status:?}); the wipe stops here")]
    StillLoaded { path: PathBuf, key: String, status: KeyStatus },
    /// Files of the volume are still open: the key's secret is gone from the kernel, but the
    /// removal completes only once they are closed.
    #[error(
        "{path}: files encrypted with {key} are still open on the host; the key is removed once they are closed (retried)"
    )]
    FilesBusy { path: PathBuf, key: String },
}

impl EncryptionError {
    fn store(path: &Path) -> impl FnOnce(KeyStoreError) -> EncryptionError + '_ {
        move |source| EncryptionError::Store { path: path.to_path_buf(), source }
    }
    fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(rustix::io::Errno) -> EncryptionError + 'a {
        move |source| EncryptionError::Io(crate::host::HostError::io(op, path, source))
    }
}

/// Opens the data directory of the volume whose root is `root`, without following a link and
/// only on the root's own mount (something mounted over it is not this volume's); `None` when
/// there is none.
fn open_data_dir(root: BorrowedFd<'_>, data: &Path) -> Result<Option<OwnedFd>, EncryptionError> {
    use rustix::fs::{StatxFlags, statx};
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let dir = match rustix::fs::openat(root, ENCRYPTED_DIR, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(EncryptionError::io("opening", data)(e)),
    };
    let mount_of = |fd: BorrowedFd<'_>| statx(fd, c"", AtFlags::EMPTY_PATH, StatxFlags::MNT_ID).map(|s| s.stx_mnt_id);
    let (outer, inner) = (mount_of(root), mount_of(dir.as_fd()));
    match (outer, inner) {
        (Ok(a), Ok(b)) if a == b => Ok(Some(dir)),
        (Ok(_), Ok(_)) => Err(EncryptionError::MountedOver { path: data.to_path_buf() }),
        (Err(e), _) | (_, Err(e)) => Err(EncryptionError::io("statx", data)(e)),
    }
}

/// Gives the data directory the mode and owner of the volume's root (what rootMode and
/// rootOwner give the root, the tenant gets), then syncs it and the root.
fn like_the_root(root: BorrowedFd<'_>, dir: BorrowedFd<'_>, path: &Path, data: &Path) -> Result<(), EncryptionError> {
    let stat = rustix::fs::fstat(root).map_err(EncryptionError::io("stat", path))?;
    let mode = Mode::from_raw_mode(stat.st_mode & 0o7777);
    rustix::fs::fchmod(dir, mode).map_err(EncryptionError::io("chmod", data))?;
    let (uid, gid) = (rustix::fs::Uid::from_raw(stat.st_uid), rustix::fs::Gid::from_raw(stat.st_gid));
    rustix::fs::fchown(dir, Some(uid), Some(gid)).map_err(EncryptionError::io("chown", data))?;
    rustix::fs::fsync(dir).map_err(EncryptionError::io("syncing", data))?;
    rustix::fs::fsync(root).map_err(EncryptionError::io("syncing", path))
}

/// Whether `recorded` (a stored key's disk) is the disk `found` now (core::identity::disk_identity).
fn same_disk(recorded: &str, found: &str) -> bool {
    use crate::core::identity::disk_identity::{Found, Verdict, judge};
    let now = Found { identity: found.to_string(), legacy: String::new(), fs_type: None };
    recorded == found || matches!(judge(recorded, &now, None), Verdict::Same(_))
}

/// Whether the directory open as `dir` has no entries (no key needed: a locked directory
/// lists its entries by their encrypted names).
fn is_empty(dir: BorrowedFd<'_>, path: &Path) -> Result<bool, EncryptionError> {
    let entries = rustix::fs::Dir::read_from(dir).map_err(EncryptionError::io("reading", path))?;
    for entry in entries {
        let entry = entry.map_err(EncryptionError::io("reading", path))?;
        if ![&b"."[..], b".."].contains(&entry.file_name().to_bytes()) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Readies the encrypted data directory of the volume whose root is open as `root` (`path`
/// inside this container; `host_path` and `identity` are recorded with the key) and returns the
/// identifier of its key:
/// - a filesystem that cannot take a policy is refused, saying what to do;
/// - an empty data directory encrypted with a key the store holds for this very disk is kept
///   (a publish that stored its key and was interrupted before its PV was made), its key
///   loaded; one whose stored key was made for another disk (a clone) is refused, kept as it is;
/// - any other empty data directory is removed and made anew;
/// - a data directory that holds files is refused: an earlier volume's data is never handed on;
/// - a new one gets a fresh key, stored durably before the policy names it, with the mode and
///   owner of the volume's root (what rootMode and rootOwner give the root, the tenant gets).
pub fn prepare(
    root: BorrowedFd<'_>,
    path: &Path,
    host_path: &str,
    identity: &str,
    store: &KeyStore,
) -> Result<KeyId, EncryptionError> {
    match fscrypt::support(root, path)? {
        Support::Usable => {}
        Support::FeatureOff => {
            return Err(EncryptionError::Unsupported {
                path: path.to_path_buf(),
                why: "the filesystem has no encrypt feature; enable it (ext4: `tune2fs -O encrypt <device>` while \
                      unmounted, or `mkfs.ext4 -O encrypt`; f2fs: `mkfs.f2fs -O encrypt`) as docs/disk-preparation.md shows"
                    .into(),
            });
        }
        Support::NotSupported => {
            return Err(EncryptionError::Unsupported {
                path: path.to_path_buf(),
                why:
                    "the filesystem cannot be encrypted with fscrypt (ext4 and f2fs made with the encrypt feature can)"
                        .into(),
            });
        }
    }
    let data = path.join(ENCRYPTED_DIR);
    if let Some(dir) = open_data_dir(root, &data)? {
        let policy = fscrypt::policy_of(dir.as_fd(), &data)?;
        let empty = is_empty(dir.as_fd(), &data)?;
        if let Some(id) = policy
            && empty
            && let Some(info) = store.info(&id).map_err(EncryptionError::store(path))?
        {
            if !same_disk(&info.identity, identity) {
                return Err(EncryptionError::OtherDisksKey { path: data, key: id.to_hex(), made_for: info.identity });
            }
            let key = store.read(&id).map_err(EncryptionError::store(path))?;
            load_key(root, &data, &id, &key)?;
            // What a crash after the policy and before these left undone.
            like_the_root(root, dir.as_fd(), path, &data)?;
            // Its age restarts, so the orphan rule does not take it for the leftover of an old
            // publish while its PV is being made.
            store.touch(&id).map_err(EncryptionError::store(path))?;
            return Ok(id);
        }
        if !empty {
            let key = policy.map_or_else(|| "no key: it is not encrypted".to_string(), |id| id.to_hex());
            return Err(EncryptionError::HoldsData { path: data, key });
        }
        drop(dir);
        rustix::fs::unlinkat(root, ENCRYPTED_DIR, AtFlags::REMOVEDIR)
            .map_err(EncryptionError::io("removing", &data))?;
    }
    let key = MasterKey::generate()?;
    let id = fscrypt::add_key(root, &key, path)?;
    store.keep(&id, &key, host_path, identity).map_err(EncryptionError::store(path))?;
    rustix::fs::mkdirat(root, ENCRYPTED_DIR, Mode::from_raw_mode(0o700))
        .map_err(EncryptionError::io("creating", &data))?;
    let dir =
        open_data_dir(root, &data)?.ok_or_else(|| EncryptionError::io("opening", &data)(rustix::io::Errno::NOENT))?;
    fscrypt::set_policy(dir.as_fd(), &id, &data)?;
    like_the_root(root, dir.as_fd(), path, &data)?;
    Ok(id)
}

/// Gives up key `id` of the volume whose root is `root` (proven by the caller to be the disk it
/// was made for) when nothing can have been written with it: its data directory is absent, or
/// empty and encrypted with it (then removed). Removed from the kernel, its stored copy
/// destroyed. A directory with files, or one encrypted with another key, keeps the key: that
/// data is the wipe's to destroy, proven, never the orphan rule's.
pub fn abandon(root: BorrowedFd<'_>, path: &Path, id: &KeyId, store: &KeyStore) -> Result<Destroyed, EncryptionError> {
    let data = path.join(ENCRYPTED_DIR);
    if let Some(dir) = open_data_dir(root, &data)? {
        let policy = fscrypt::policy_of(dir.as_fd(), &data)?;
        if policy == Some(*id) && !is_empty(dir.as_fd(), &data)? {
            return Err(EncryptionError::HoldsData { path: data, key: id.to_hex() });
        }
        if policy == Some(*id) {
            drop(dir);
            rustix::fs::unlinkat(root, ENCRYPTED_DIR, AtFlags::REMOVEDIR)
                .map_err(EncryptionError::io("removing", &data))?;
            rustix::fs::fsync(root).map_err(EncryptionError::io("syncing", path))?;
        }
    }
    destroy(root, path, id, store)
}

/// The key the data directory of the volume whose root is `root` is encrypted with; `None`
/// when there is no such directory (never followed through a link) or it is not encrypted.
pub fn data_key(root: BorrowedFd<'_>, path: &Path) -> Result<Option<KeyId>, EncryptionError> {
    let data = path.join(ENCRYPTED_DIR);
    match open_data_dir(root, &data)? {
        Some(dir) => Ok(fscrypt::policy_of(dir.as_fd(), &data)?),
        None => Ok(None),
    }
}

/// Adds `key` to the filesystem of `root` and checks the kernel derives `id` from it.
fn load_key(root: BorrowedFd<'_>, path: &Path, id: &KeyId, key: &MasterKey) -> Result<(), EncryptionError> {
    let found = fscrypt::add_key(root, key, path)?;
    if found != *id {
        return Err(EncryptionError::KeyMismatch {
            path: path.to_path_buf(),
            found: found.to_hex(),
            wanted: id.to_hex(),
        });
    }
    Ok(())
}

/// Whether the kernel has key `key` (hex identifier) for the filesystem of the volume at
/// `path` (opened as a volume root: a directory, no link followed). One ioctl: the presence
/// check of every pass asks it of each encrypted PV, so a key lost by a remount or a reboot
/// is loaded again at the next pass, and a present one costs nothing more.
pub fn key_present(path: &Path, key: &str) -> Result<bool, String> {
    let id = KeyId::from_hex(key).ok_or_else(|| format!("{key:?} is not a key identifier"))?;
    let root = crate::host::identity::used_mark::open_volume_root(path).map_err(|e| e.to_string())?;
    Ok(fscrypt::key_status(root.as_fd(), &id, path).map_err(|e| e.to_string())? == KeyStatus::Present)
}

/// Whether [`load`] found the key in the kernel already or added it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loaded {
    AlreadyPresent,
    Added,
}

/// Has key `id` in the kernel for the volume whose root is open as `root`: the data directory
/// must be there and encrypted with exactly that key (else it is not the directory published);
/// a key the kernel lacks is read from the store and added.
pub fn load(root: BorrowedFd<'_>, path: &Path, id: &KeyId, store: &KeyStore) -> Result<Loaded, EncryptionError> {
    let data = path.join(ENCRYPTED_DIR);
    let dir =
        open_data_dir(root, &data)?.ok_or_else(|| EncryptionError::io("opening", &data)(rustix::io::Errno::NOENT))?;
    match fscrypt::policy_of(dir.as_fd(), &data)? {
        Some(found) if found == *id => {}
        found => {
            let found = found.map_or_else(|| "no key (not encrypted)".to_string(), |f| f.to_hex());
            return Err(EncryptionError::WrongKey { path: data, found, wanted: id.to_hex() });
        }
    }
    if fscrypt::key_status(root, id, path)? == KeyStatus::Present {
        return Ok(Loaded::AlreadyPresent);
    }
    let key = store.read(id).map_err(EncryptionError::store(path))?;
    load_key(root, path, id, &key)?;
    Ok(Loaded::Added)
}

/// What [`destroy`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Destroyed {
    /// The key was in the kernel and was removed from it.
    pub was_loaded: bool,
    /// The node's store held a copy, now destroyed.
    pub was_stored: bool,
}

/// Destroys key `id`: removed from the kernel for every user (its secret is wiped at once;
/// the inodes it unlocked are evicted), then its stored copy destroyed durably. The caller has
/// proven the disk is the PV's and that kubelet holds no mount of it. Files still open fail
/// with [`EncryptionError::FilesBusy`] before the stored copy goes, so a retry completes it.
pub fn destroy(root: BorrowedFd<'_>, path: &Path, id: &KeyId, store: &KeyStore) -> Result<Destroyed, EncryptionError> {
    let removal = fscrypt::remove_key(root, id, path)?;
    if removal == Removal::FilesBusy {
        return Err(EncryptionError::FilesBusy { path: path.to_path_buf(), key: id.to_hex() });
    }
    // Shown, not assumed: the kernel no longer has it (a key still in use would be
    // incompletely removed, which the removal above already refused).
    let status = fscrypt::key_status(root, id, path)?;
    if status != KeyStatus::Absent {
        return Err(EncryptionError::StillLoaded { path: path.to_path_buf(), key: id.to_hex(), status });
    }
    let was_stored = store.destroy(id).map_err(EncryptionError::store(path))?;
    Ok(Destroyed { was_loaded: removal == Removal::Removed, was_stored })
}

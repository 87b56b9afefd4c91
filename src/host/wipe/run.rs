//! The blocking half of a wipe, run on the host through [`crate::host::access::HostAccess`]:
//! what the entry is, whether the disk there is the one published (proven again on the very
//! descriptor the wipe writes through), the wipe itself, and clearing the disk's used mark.
//! Host work, so it lives in `host` (it was wiper/on_host.rs); the wiper schedules it.

use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use tracing::{info, warn};

use crate::config::BlockCleanMethod;
use crate::core::devices::activity::IoStat;
use crate::core::identity::disk_identity::{Found, Proof, Verdict, judge};
use crate::core::wipe::cleanup::PvState;
use crate::core::wipe::wipe_history::KeyErased;
use crate::core::wipe::wipe_history::{CRYPTO_ERASE, FILESYSTEM};
use crate::core::wipe::wipe_job::{Progress, WipeError, WipeJob, Wiped};
use crate::host::identity::fingerprint::{device_identity, directory_identity, found_identity};
use crate::host::identity::used_mark::{Ledger, clear_dir_mark, open_volume_root};
use crate::host::mounts::mountinfo::MountTable;
use crate::host::volumes::discovery::wipe_exposure;
use crate::host::volumes::fscrypt::KeyId;
use crate::host::volumes::key_store::KeyStore;
use crate::host::volumes::kubelet::{KubeletError, KubeletView, Subject};
use crate::host::volumes::volume::{EntryKind, block_device_capacity, filesystem_capacity, mount_of_fd, resolve_entry};
use crate::host::wipe::wipe_block::{
    BlockMethod, BlockWipeError, builtin_for_upstream_command, run_cleaner_command_until, wipe_block_verified,
};
use crate::host::wipe::wipe_fs::{FsWipeError, wipe_filesystem_counted};
use crate::host::wipe::wipe_record::{self as record, Now, WipedRecord, Written};

/// Checks the disk, waits for kubelet to let go of it, wipes it and clears its used mark.
/// Blocks; `progress.total` is set as soon as the size is known, so the caller can scale its
/// timeout. A wipe whose PV is finished afterwards (`job.resumable`) is recorded durably
/// (host::wipe::wipe_record) once complete; when such a record holds, the disk is not wiped again.
pub fn wipe(
    ledger: &Ledger,
    kubelet: &KubeletView,
    job: &WipeJob,
    cancel: &AtomicBool,
    progress: &Progress,
) -> Result<Wiped, WipeError> {
    let state_dir = ledger.path().parent().map(Path::to_path_buf);
    let state_dir = state_dir.filter(|_| job.resumable);
    if let Some(dir) = &state_dir
        && let Some(done) = resume(ledger, kubelet, job, dir)?
    {
        return Ok(done);
    }
    let wiped = wipe_volume(ledger, kubelet, job, cancel, progress)?;
    if let Some(dir) = &state_dir {
        let written = if wiped.mode == "block" { device_written(&job.target.path) } else { None };
        let record = WipedRecord {
            uid: job.pv.uid.clone(),
            claim: claim_uid(job),
            identity: wiped.identity.clone(),
            mode: wiped.mode.to_string(),
            written,
            at: Some(wiped.at.clone()),
            method: Some(wiped.method.clone()),
            bytes: Some(wiped.bytes),
            key_erased: wiped.key_erased.clone(),
        };
        // Only saves a second wipe: without the record a retry wipes again, as before.
        match record::keep(dir, record) {
            Ok(()) => info!(pv = %job.pv.name, "completed wipe recorded; a retry only finishes the PV"),
            Err(e) => warn!(pv = %job.pv.name, error = %e, "could not record the completed wipe"),
        }
    }
    Ok(wiped)
}

/// The UID of the claim the job's PV was released by.
fn claim_uid(job: &WipeJob) -> Option<String> {
    job.pv.claim.as_ref().map(|(_, _, uid)| uid.clone())
}

/// The boot and the write counters of the block device at `path` (followed to the device),
/// and for a loop device its backing file's state (host::wipe::wipe_record::Written::backing).
fn device_written(path: &Path) -> Option<Written> {
    let rdev = std::os::unix::fs::MetadataExt::rdev(&std::fs::metadata(path).ok()?);
    let (major, minor) = (nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev));
    let sys = format!("/sys/dev/block/{major}:{minor}");
    let stat = std::fs::read_to_string(format!("{sys}/stat")).ok()?;
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let backing = match std::fs::read_to_string(format!("{sys}/loop/backing_file")) {
        // A loop device whose backing file cannot be looked at cannot show it is unchanged.
        Ok(file) => Some(backing_state(path, file.trim_end_matches('\n'))?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(_) => return None,
    };
    Some(Written::from_stat(boot.trim(), &IoStat::parse(&stat)?, backing))
}

/// The backing file of the loop device at `device` as `dev:ino size mtime ctime` (nanoseconds):
/// a write to the file moves its times even when the loop device's counters do not. Only when
/// the file its path names here is the one the loop driver holds (LOOP_GET_STATUS64's device
/// and inode): in another mount namespace the path may name another file, or none.
fn backing_state(device: &Path, file: &str) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let status = crate::host::devices::blockdev::loop_status(std::fs::File::open(device).ok()?).ok()?;
    let m = std::fs::metadata(file.trim_end_matches(" (deleted)")).ok()?;
    if m.dev() != status.device || m.ino() != status.inode {
        return None;
    }
    Some(format!(
        "{}:{} {} {}.{:09} {}.{:09}",
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec()
    ))
}

/// A wipe of this PV completed before (its record in `state_dir`) and its PV was not
/// finished: when the record still holds (host::wipe::wipe_record::honoured, proven on a descriptor
/// of the disk), the used marks are cleared again (a pass may have written them since) and
/// the wipe is not done again. A record that does not hold is dropped.
fn resume(ledger: &Ledger, kubelet: &KubeletView, job: &WipeJob, state_dir: &Path) -> Result<Option<Wiped>, WipeError> {
    let records = match record::read(state_dir) {
        Ok(records) => records,
        Err(e) => {
            warn!(pv = %job.pv.name, error = %e, "completed wipes cannot be read; wiping");
            return Ok(None);
        }
    };
    let Some(recorded) = records.into_iter().find(|r| r.uid == job.pv.uid) else { return Ok(None) };
    let path = job.target.path.clone();
    let failed = |e: &dyn std::fmt::Display| WipeError::Failed(e.to_string());
    let checked = check_volume(&job.pv, &path)?;
    let mounts = MountTable::read().map_err(|e| failed(&e))?;
    not_held_by_kubelet(kubelet, &path, &checked, &mounts)?;
    let claim = claim_uid(job);
    let (verdict, identity, root) = match &checked {
        Checked::Filesystem { root, .. } => {
            let dir = open_volume_root(root).map_err(|e| failed(&e))?;
            let fd = std::os::fd::AsFd::as_fd(&dir);
            if let Some(why) = mount_of_fd(fd, &mounts).and_then(|m| wipe_exposure(m, &mounts, &job.target.class)) {
                return Err(WipeError::Refused(format!("{} is not wiped: {why}", root.display())));
            }
            let found = directory_identity(fd, root, Some(&mounts)).map_err(|e| failed(&e))?;
            let identity = found.identity.clone();
            prove_identity(&job.pv, root, found)?;
            let entries = rustix::fs::Dir::read_from(fd)
                .map_err(|e| failed(&format!("reading {}: {e}", root.display())))?
                .filter(|e| e.as_ref().map_or(true, |e| ![&b"."[..], b".."].contains(&e.file_name().to_bytes())))
                .count();
            let now = Now::Filesystem { entries };
            (record::honoured(&recorded, &job.pv.uid, claim.as_deref(), &identity, &now), identity, Some((dir, root)))
        }
        Checked::Block { .. } => {
            // Exclusively, as the wipe would: nobody has mounted or claimed it since.
            let file = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(nix::fcntl::OFlag::O_EXCL.bits())
                .open(&path)
                .map_err(|e| failed(&format!("opening {} exclusively: {e}", path.display())))?;
            let found = device_identity(&file, &path).map_err(|e| failed(&e))?;
            let identity = found.identity.clone();
            prove_identity(&job.pv, &path, found)?;
            let now = Now::Block { written: device_written(&path) };
            (record::honoured(&recorded, &job.pv.uid, claim.as_deref(), &identity, &now), identity, None)
        }
    };
    if let Err(why) = verdict {
        info!(pv = %job.pv.name, path = %path.display(), %why, "the recorded wipe does not hold; wiping again");
        let uid = job.pv.uid.as_str();
        if let Err(e) = record::retain(state_dir, &|u| u != uid) {
            warn!(pv = %job.pv.name, error = %e, "could not drop the completed wipe's record");
        }
        return Ok(None);
    }
    let mode = match root {
        Some((dir, root)) => {
            let fd = std::os::fd::AsFd::as_fd(&dir);
            let dir = mount_of_fd(fd, &mounts).map(|m| m.root.display().to_string());
            clear_marks(ledger, Some(fd), root, &identity, dir.as_deref())?;
            "fs"
        }
        None => {
            clear_marks(ledger, None, &path, &identity, None)?;
            "block"
        }
    };
    info!(pv = %job.pv.name, path = %path.display(), "wiped before and unchanged since (recorded); not wiped again");
    Ok(Some(Wiped {
        mode,
        bytes: recorded.bytes.unwrap_or(0),
        resumed: true,
        identity,
        method: recorded.method.unwrap_or_else(|| mode.to_string()),
        at: recorded.at.unwrap_or_default(),
        key_erased: recorded.key_erased,
    }))
}

/// The wipe itself; returns what it wiped, how, and the identity it proved.
fn wipe_volume(
    ledger: &Ledger,
    kubelet: &KubeletView,
    job: &WipeJob,
    cancel: &AtomicBool,
    progress: &Progress,
) -> Result<Wiped, WipeError> {
    let path = job.target.path.clone();
    let failed = |e: &dyn std::fmt::Display| WipeError::Failed(e.to_string());
    let key = key_of_job(job)?;
    let checked = check_volume(&job.pv, &path)?;
    let mounts = MountTable::read().map_err(|e| failed(&e))?;
    not_held_by_kubelet(kubelet, &path, &checked, &mounts)?;
    let state_dir = ledger.path().parent();
    match checked {
        Checked::Filesystem { root, size } => {
            progress.size.store(size, Ordering::Relaxed);
            progress.total.store(size, Ordering::Relaxed);
            let class = &job.target.class;
            // The identity is proven again on the descriptor the walk starts from: a mount
            // swapped in at the path since the check above is caught.
            let mut refusal = None;
            // The descriptor and identity proven, kept to clear the used mark of exactly this
            // disk once the wipe is complete.
            let mut proven: Option<(std::os::fd::OwnedFd, String)> = None;
            // An encrypted volume's key goes first, on the descriptor just proven: its data is
            // unreadable from then on, whatever the removal of its files leaves on the disk.
            let mut key_erased = None;
            let mut verify = |fd: std::os::fd::BorrowedFd<'_>| {
                // Never the host itself, whatever identity the PV recorded (or not).
                if let Some(why) = mount_of_fd(fd, &mounts).and_then(|m| wipe_exposure(m, &mounts, class)) {
                    let e = WipeError::Refused(format!("{} is not wiped: {why}", root.display()));
                    let text = e.to_string();
                    refusal = Some(e);
                    return Err(text);
                }
                let found = directory_identity(fd, &root, Some(&mounts)).map_err(|e| e.to_string())?;
                let identity = found.identity.clone();
                prove_identity(&job.pv, &root, found).map_err(|e| {
                    let text = e.to_string();
                    refusal = Some(e);
                    text
                })?;
                if key_erased.is_none() {
                    match erase_key(fd, &root, key.as_ref(), &identity, state_dir) {
                        Ok(erased) => key_erased = erased,
                        Err(e) => {
                            let text = e.to_string();
                            refusal = Some(e);
                            return Err(text);
                        }
                    }
                }
                proven = Some((fd.try_clone_to_owned().map_err(|e| e.to_string())?, identity));
                Ok(())
            };
            let result = wipe_filesystem_counted(
                &root,
                &mounts,
                cancel,
                Some(&progress.beats),
                class.configured_root(),
                &mut verify,
            );
            let stats = result.map_err(|e| match e {
                FsWipeError::NotTheVolume { .. } => refusal.take().unwrap_or(WipeError::Refused(e.to_string())),
                FsWipeError::NestedMount { .. } | FsWipeError::NotMounted { .. } | FsWipeError::Immutable { .. } => {
                    WipeError::Refused(e.to_string())
                }
                _ => WipeError::Failed(e.to_string()),
            })?;
            let Some((fd, identity)) = proven else {
                return Err(WipeError::Failed("the wipe finished without proving the volume".into()));
            };
            let fd = std::os::fd::AsFd::as_fd(&fd);
            let dir = mount_of_fd(fd, &mounts).map(|m| m.root.display().to_string());
            clear_marks(ledger, Some(fd), &root, &identity, dir.as_deref())?;
            let method = if key_erased.is_some() { CRYPTO_ERASE } else { FILESYSTEM };
            Ok(Wiped { key_erased, ..completed("fs", stats.bytes_freed, identity, method.into()) })
        }
        Checked::Block { .. } if key.is_some() => Err(WipeError::Refused(format!(
            "PV {} names an encryption key but {} is a block device: not the volume published; not wiped",
            job.pv.name,
            path.display()
        ))),
        Checked::Block { size, found } => {
            progress.size.store(size, Ordering::Relaxed);
            progress.total.store(size, Ordering::Relaxed);
            match block_method(job)? {
                Err(cmd) => {
                    let timeout = job.timeout_for(size);
                    let run = run_cleaner_command_until(&cmd, &path, &job.pv.name, timeout, cancel);
                    // The upstream-style cleaner script runs as a child process, awaited from
                    // this blocking thread on the runtime it belongs to.
                    tokio::runtime::Handle::current().block_on(run).map_err(|e| failed(&e))?;
                    clear_marks(ledger, None, &path, &found, None)?;
                    let name = Path::new(&cmd[0]).file_name().map(|n| n.to_string_lossy().into_owned());
                    let method = format!("command {}", name.unwrap_or_else(|| cmd[0].clone()));
                    Ok(completed("block", size, found, method))
                }
                Ok(method) => {
                    // Multi-pass methods write the device several times: progress and the
                    // timeout count every pass.
                    progress.total.store(method.work_bytes(size), Ordering::Relaxed);
                    // Proven again on the exclusively opened device the wipe writes through: a
                    // link or device swapped in since the check is caught.
                    let mut refusal = None;
                    let mut proven = None;
                    let mut verify = |file: &std::fs::File| {
                        let found = device_identity(file, &path).map_err(|e| e.to_string())?;
                        let identity = found.identity.clone();
                        prove_identity(&job.pv, &path, found).map_err(|e| {
                            let text = e.to_string();
                            refusal = Some(e);
                            text
                        })?;
                        proven = Some(identity);
                        Ok(())
                    };
                    let mut report = |d, _| progress.done.store(d, Ordering::Relaxed);
                    wipe_block_verified(&path, method, cancel, &mut report, &mut verify).map_err(|e| match e {
                        BlockWipeError::NotTheDisk { .. } => {
                            refusal.take().unwrap_or(WipeError::Refused(e.to_string()))
                        }
                        _ => WipeError::Failed(e.to_string()),
                    })?;
                    let identity = proven.unwrap_or(found);
                    clear_marks(ledger, None, &path, &identity, None)?;
                    Ok(completed("block", size, identity, method.as_str().to_string()))
                }
            }
        }
    }
}

/// A wipe that completed now.
fn completed(mode: &'static str, bytes: u64, identity: String, method: String) -> Wiped {
    Wiped { mode, bytes, resumed: false, identity, method, at: now_rfc3339(), key_erased: None }
}

/// Now, to the second (RFC 3339).
fn now_rfc3339() -> String {
    use k8s_openapi::jiff::{Timestamp, Unit};
    let now = Timestamp::now();
    now.round(Unit::Second).unwrap_or(now).to_string()
}

/// The key an encrypted volume's PV names, to be destroyed before its files are removed;
/// refused while the PV's annotation cannot be read (which key is unknown).
fn key_of_job(job: &WipeJob) -> Result<Option<KeyId>, WipeError> {
    match &job.pv.encryption {
        None => Ok(None),
        Some(Err(why)) => Err(WipeError::Refused(format!(
            "PV {}: its encryption annotation cannot be read ({why}), so which key to destroy is unknown; not wiped",
            job.pv.name
        ))),
        Some(Ok(hex)) => KeyId::from_hex(hex).map(Some).ok_or_else(|| {
            WipeError::Refused(format!("PV {}: {hex:?} is not a key identifier; not wiped", job.pv.name))
        }),
    }
}

/// Destroys the key of the encrypted volume whose root `fd` the wipe proved is the PV's disk
/// (`identity`): removed from the kernel, shown absent, its stored copy destroyed. The key is
/// the one its PV names (`named`), or, for a volume without one (a wipe-first), the one its
/// data directory is encrypted with when the node's store holds it (a tenant's own key is
/// never taken for one of ours). Refused, destroying nothing, when the data directory names
/// another key than the PV, or the stored key was made for another disk: a key is destroyed
/// only on the disk it was made for. `None`: nothing of ours to destroy.
fn erase_key(
    fd: std::os::fd::BorrowedFd<'_>,
    root: &Path,
    named: Option<&KeyId>,
    identity: &str,
    state_dir: Option<&Path>,
) -> Result<Option<KeyErased>, WipeError> {
    let failed = |e: &dyn std::fmt::Display| {
        WipeError::KeyNotDestroyed(format!("destroying the key of {}: {e}; nothing was removed", root.display()))
    };
    let refused =
        |why: String| WipeError::Refused(format!("{}: {why}; no key destroyed, nothing removed", root.display()));
    let Some(state_dir) = state_dir else {
        return match named {
            Some(id) => Err(failed(&format!("no state directory holds its key {id}"))),
            None => Ok(None),
        };
    };
    let store = KeyStore::new(state_dir);
    let id = match named {
        Some(id) => match crate::host::volumes::encryption::data_key(fd, root).map_err(|e| failed(&e))? {
            Some(there) if there != *id => {
                return Err(refused(format!(
                    "its data directory is encrypted with {there}, not with the key its PV names ({id}): not the volume published"
                )));
            }
            _ => *id,
        },
        // No key named: only a data directory encrypted with a key the node keeps is ours.
        // Whatever else a tenant left under that name (a file, a link, a directory on a
        // filesystem without fscrypt) is an ordinary entry the wipe removes.
        None => match crate::host::volumes::encryption::data_key(fd, root) {
            Ok(Some(there)) if matches!(store.info(&there), Ok(Some(_))) => there,
            _ => return Ok(None),
        },
    };
    if let Some(info) = store.info(&id).map_err(|e| failed(&e))? {
        let found = Found { identity: identity.to_string(), legacy: String::new(), fs_type: None };
        let same = info.identity == identity || matches!(judge(&info.identity, &found, None), Verdict::Same(_));
        if !same {
            return Err(refused(format!(
                "the stored key {id} was made for another disk ({}, at {}), not this one ({identity})",
                info.identity, info.host_path
            )));
        }
    }
    crate::host::volumes::encryption::destroy(fd, root, &id, &store).map_err(|e| failed(&e))?;
    Ok(Some(KeyErased { key: id.to_hex(), at: now_rfc3339() }))
}

/// Fails with [`WipeError::InUse`] while kubelet still has the volume at `path` mounted for a
/// pod, and refuses when this agent cannot see kubelet's mounts although it should.
fn not_held_by_kubelet(
    kubelet: &KubeletView,
    path: &Path,
    checked: &Checked,
    mounts: &MountTable,
) -> Result<(), WipeError> {
    let subject = match checked {
        Checked::Filesystem { root, .. } => match Subject::filesystem_at(root, mounts) {
            Some(s) => s,
            None => return Err(WipeError::Refused(format!("{} is not a mount point any more", root.display()))),
        },
        Checked::Block { .. } => Subject::device_at(path).map_err(|e| WipeError::Failed(e.to_string()))?,
    };
    match kubelet.holder(&subject, mounts) {
        Ok(None) => Ok(()),
        Ok(Some(by)) => Err(WipeError::InUse { path: path.to_path_buf(), by }),
        Err(e @ KubeletError::NotVisible { .. }) => Err(WipeError::Refused(e.to_string())),
        Err(e) => Err(WipeError::Failed(e.to_string())),
    }
}

/// The class's way of wiping a block device: a built-in method (also for upstream's own
/// scripts, which have one), or a command that exists in this container.
pub fn block_method(job: &WipeJob) -> Result<Result<BlockMethod, Vec<String>>, WipeError> {
    let class = &job.target.class;
    Ok(match (class.block_clean_method, &class.block_cleaner_command) {
        (Some(m), _) => Ok(builtin(m)),
        (None, cmd) if !cmd.is_empty() && Path::new(&cmd[0]).exists() => Err(cmd.clone()),
        (None, cmd) => match builtin_for_upstream_command(cmd) {
            Some(Ok(m)) => Ok(m),
            Some(Err(why)) => {
                return Err(WipeError::Refused(format!(
                    "blockCleanerCommand {cmd:?} does not exist in this container and its built-in equivalent cannot be used: {why}; set blockCleanMethod or mount the script"
                )));
            }
            None => {
                return Err(WipeError::Refused(format!(
                    "blockCleanerCommand {cmd:?} does not exist in this container and has no built-in equivalent; set blockCleanMethod or mount the script"
                )));
            }
        },
    })
}

fn builtin(m: BlockCleanMethod) -> BlockMethod {
    match m {
        BlockCleanMethod::Quick => BlockMethod::Quick,
        BlockCleanMethod::Discard => BlockMethod::Discard,
        BlockCleanMethod::Zero => BlockMethod::Zero,
    }
}

/// What the wipe found at the volume's path, after the identity check.
enum Checked {
    /// A mounted filesystem: its root (canonical parent + entry name) and size in bytes.
    Filesystem { root: PathBuf, size: u64 },
    /// A block device (the path, or a symlink to it), its size in bytes and the identity
    /// proven (the ledger entry a completed wipe clears).
    Block { size: u64, found: String },
}

/// What the entry is (a symlink is followed only to a block device), whether the disk there is
/// the recorded one, and its size.
fn check_volume(pv: &PvState, path: &Path) -> Result<Checked, WipeError> {
    let failed = |e: &dyn std::fmt::Display| WipeError::Failed(e.to_string());
    let (kind, resolved) = resolve_entry(path).map_err(|e| failed(&e))?;
    match kind {
        EntryKind::Directory | EntryKind::BlockDevice => {}
        EntryKind::Symlink => {
            return Err(WipeError::Refused(format!(
                "{} is a symlink to something other than a block device; it is never followed",
                path.display()
            )));
        }
        EntryKind::Other => {
            return Err(WipeError::Refused(format!("{} is neither a directory nor a block device", path.display())));
        }
    }
    let found = found_identity(path, None).map_err(|e| failed(&e))?;
    let identity = found.identity.clone();
    prove_identity(pv, path, found)?;
    Ok(match kind {
        EntryKind::BlockDevice => {
            Checked::Block { size: block_device_capacity(path).map_err(|e| failed(&e))?, found: identity }
        }
        _ => Checked::Filesystem { size: filesystem_capacity(&resolved).map_err(|e| failed(&e))?, root: resolved },
    })
}

/// Clears the used mark of a disk whose wipe just completed: the attribute on the volume root
/// (through the descriptor the wipe proved, never by path) and the ledger's entries for what
/// the wipe removed (the identity proven, at `dir` of its filesystem; see
/// core::identity::used_mark::wiped_by). Until both are gone the wipe counts as failed and is done again.
fn clear_marks(
    ledger: &Ledger,
    root: Option<std::os::fd::BorrowedFd<'_>>,
    path: &Path,
    identity: &str,
    dir: Option<&str>,
) -> Result<(), WipeError> {
    let failed = |e: crate::host::identity::used_mark::MarkError| WipeError::Failed(format!("wiped, but {e}"));
    if let Some(fd) = root {
        clear_dir_mark(fd, path).map_err(failed)?;
    }
    ledger.clear(identity, dir).map_err(failed)
}

/// Whether `found` (the disk at `path`) proves to be the PV's recorded disk: the same, or
/// unproven and confirmed by an operator for exactly this identity. A PV that recorded no
/// identity (made by upstream) is wiped as upstream would, with a warning.
fn prove_identity(pv: &PvState, path: &Path, found: Found) -> Result<(), WipeError> {
    match &pv.identity {
        Some(recorded) => match judge(recorded, &found, pv.identity_confirmed.as_deref()) {
            Verdict::Same(Proof::Confirmed) => {
                warn!(pv = %pv.name, path = %path.display(), identity = %found.identity, "disk identity unproven but confirmed by an operator; wiping")
            }
            Verdict::Same(_) => {}
            Verdict::Different(reason) => {
                return Err(WipeError::IdentityMismatch {
                    path: path.to_path_buf(),
                    recorded: recorded.clone(),
                    found: found.identity,
                    reason,
                });
            }
            Verdict::Unproven { reason, .. } => {
                return Err(WipeError::IdentityUnproven {
                    host_path: pv.host_path.clone(),
                    pv: pv.name.clone(),
                    recorded: recorded.clone(),
                    found: found.identity,
                    reason,
                });
            }
        },
        None => {
            warn!(pv = %pv.name, path = %path.display(), "PV has no recorded volume identity (made by upstream?); wiping what is at its path")
        }
    }
    Ok(())
}

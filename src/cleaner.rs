//! The cleaner executor: runs the wipes the cleanup planner asks for, each in the background
//! with a concurrency limit and a timeout that scales with the volume's size, and finishes the
//! PV (delete it, or drop our finalizer) only after the wipe succeeded. Before wiping it checks
//! that the path still holds the very disk that was published (core::disk_identity): a disk
//! proven to be another is never wiped, and one that cannot be proven the same waits for an
//! operator's confirmation of exactly the identity found.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, mpsc};
use tracing::{debug, info, warn};

use k8s_openapi::api::core::v1::ObjectReference;

use crate::api::{Cluster, pv_reference};
use crate::config::{BlockCleanMethod, ClassConfig};
use crate::core::cleanup::{AfterWipe, PvState};
use crate::core::disk_identity::{Found, Proof, Verdict, judge};
use crate::core::naming::{ANN_CLEANUP_RESULT, ANN_IDENTITY_CONFIRMED, FINALIZER_WIPE};
use crate::discovery::wipe_exposure;
use crate::host::identity::{device_identity, directory_identity, found_identity};
use crate::host::mountinfo::MountTable;
use crate::host::used_mark::{Ledger, clear_dir_mark};
use crate::host::volume::{EntryKind, block_device_capacity, filesystem_capacity, mount_of_fd, resolve_entry};
use crate::host::wipe_block::{
    BlockMethod, BlockWipeError, builtin_for_upstream_script, run_cleaner_command, wipe_block_verified,
};
use crate::host::wipe_fs::{FsWipeError, wipe_filesystem_verified};
use crate::metrics::Metrics;

/// Limits for wipes.
#[derive(Debug, Clone)]
pub struct CleanerOptions {
    /// Wipes running at once (across volumes).
    pub concurrency: usize,
    /// Time every wipe gets regardless of size.
    pub timeout_base: Duration,
    /// Slowest rate (bytes per second) a wipe is allowed before it times out.
    pub min_rate: u64,
}

/// Why a wipe did not complete.
#[derive(Debug, thiserror::Error)]
pub enum WipeError {
    /// The disk at the path is provably not the one that was published: never wipe it.
    #[error(
        "volume identity mismatch at {path}: {reason}. PV recorded {recorded:?}, found {found:?}; a different disk sits at this path and is not wiped. Put the PV's own disk back at this path to have it wiped"
    )]
    IdentityMismatch { path: PathBuf, recorded: String, found: String, reason: String },
    /// Nothing proves that the disk at the path is the one that was published (no stable
    /// device ID, or an identity recorded in the old format that cannot tell): not wiped until
    /// an operator confirms exactly the identity found.
    #[error(
        "volume identity unproven at {host_path}: {reason}. If the disk there is the one PV {pv} used (check on the node with `lsblk -o NAME,SERIAL,WWN,UUID,MOUNTPOINTS` and its files), allow the wipe with: kubectl annotate pv {pv} --overwrite {ANN_IDENTITY_CONFIRMED}='{found}' (recorded: {recorded:?})"
    )]
    IdentityUnproven { host_path: String, pv: String, recorded: String, found: String, reason: String },
    /// The PV cannot be mapped to a path this agent sees.
    #[error("{0}")]
    Unmapped(String),
    /// The wipe itself failed (I/O error, tree changed, cancelled); retried soon.
    #[error("{0}")]
    Failed(String),
    /// The volume is in a state only an operator can fix (nested mount, not mounted,
    /// immutable file, wrong entry type, missing cleaner): retried rarely.
    #[error("{0}")]
    Refused(String),
    /// The wipe took longer than its size allows.
    #[error("wipe of {path} timed out after {after:?}")]
    TimedOut { path: PathBuf, after: Duration },
    /// The wipe succeeded but the PV could not be finished; it is retried (and wiped again).
    #[error("finishing PV after the wipe: {0}")]
    Api(#[from] crate::api::ApiError),
}

impl WipeError {
    /// Refusals that will not go away by retrying soon: they wait for an operator.
    fn is_refusal(&self) -> bool {
        matches!(
            self,
            WipeError::IdentityMismatch { .. }
                | WipeError::IdentityUnproven { .. }
                | WipeError::Unmapped(_)
                | WipeError::Refused(_)
        )
    }
}

/// Where a PV's volume is, as this agent sees it, and how its class wants it wiped.
#[derive(Debug, Clone)]
pub struct WipeTarget {
    /// Path under the class's mountDir.
    pub path: PathBuf,
    /// The class settings (block method or command).
    pub class: ClassConfig,
}

/// Maps a PV's host path to the path inside this container via its class's hostDir/mountDir.
pub fn target_for(pv: &PvState, class: Option<&ClassConfig>) -> Result<WipeTarget, String> {
    let class =
        class.ok_or_else(|| format!("StorageClass {:?} is not in the config; cannot locate its volume", pv.class))?;
    let host_dir = crate::core::pv::clean_path(&class.host_dir);
    let rel = pv
        .host_path
        .strip_prefix(&format!("{host_dir}/"))
        .filter(|rel| !rel.is_empty() && !rel.contains('/') && *rel != "." && *rel != "..")
        .ok_or_else(|| format!("path {} is not an entry of hostDir {host_dir}", pv.host_path))?;
    Ok(WipeTarget { path: Path::new(&class.mount_dir).join(rel), class: class.clone() })
}

/// The result of one wipe task, fed back to the reconcile loop.
#[derive(Debug)]
pub struct WipeOutcome {
    /// PV UID.
    pub uid: String,
    /// PV name.
    pub name: String,
    /// What happened.
    pub result: Result<(), WipeError>,
}

/// Tracks running wipes and failures waiting for a retry.
pub struct Cleaner {
    cluster: Cluster,
    opts: CleanerOptions,
    permits: Arc<Semaphore>,
    /// Wipes in flight: their cancel flag and the confirmation annotation they started with.
    running: BTreeMap<String, (Arc<AtomicBool>, Option<String>)>,
    backoff: BTreeMap<String, (Instant, Duration)>,
    /// PVs refused because their identity is unproven, with the confirmation they were refused
    /// with: they are not reported busy, so a new confirmation is acted on at the next pass,
    /// but `start` skips them until that annotation changes or their backoff ends.
    awaiting: BTreeMap<String, Awaiting>,
    done_tx: mpsc::UnboundedSender<WipeOutcome>,
    metrics: Metrics,
    /// The node-local record of used disks, cleared for a disk once its wipe completes.
    ledger: Ledger,
}

impl Cleaner {
    /// A cleaner whose finished wipes are reported on the returned channel.
    pub fn new(
        cluster: Cluster,
        opts: CleanerOptions,
        metrics: Metrics,
        ledger: Ledger,
    ) -> (Self, mpsc::UnboundedReceiver<WipeOutcome>) {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let permits = Arc::new(Semaphore::new(opts.concurrency.max(1)));
        let cleaner = Cleaner {
            cluster,
            opts,
            permits,
            running: BTreeMap::new(),
            backoff: BTreeMap::new(),
            awaiting: BTreeMap::new(),
            done_tx,
            metrics,
            ledger,
        };
        (cleaner, done_rx)
    }

    /// UIDs the planner must leave alone: wiping now, or failed recently.
    pub fn busy(&mut self) -> BTreeSet<String> {
        let now = Instant::now();
        self.backoff.retain(|_, (until, _)| *until > now);
        self.running.keys().chain(self.backoff.keys()).cloned().collect()
    }

    /// When the next backed-off wipe may be retried, so the loop can wake up for it.
    pub fn next_retry(&self) -> Option<Instant> {
        self.backoff.values().map(|(until, _)| *until).chain(self.awaiting.values().map(|a| a.until)).min()
    }

    /// Starts wiping in the background, unless the PV was refused for an unproven identity
    /// and nothing changed since (same confirmation annotation, backoff not over).
    pub fn start(&mut self, pv: PvState, after: AfterWipe, target: WipeTarget) {
        let regarding = pv_reference(&pv.name);
        self.spawn(pv, after, target, regarding);
    }

    /// Wipes a used disk that no PV names any more (its used mark is set, its PV is gone),
    /// before discovery publishes it as `name`: the same identity proof on the wipe's own
    /// descriptor, then the mark is cleared. Events go to `node`. Keyed by `key` in `busy`.
    pub fn start_wipe_first(
        &mut self,
        key: String,
        name: &str,
        host_path: &str,
        identity: &str,
        target: WipeTarget,
        node: ObjectReference,
    ) {
        // The identity was found by discovery moments ago; the check on the wipe's descriptor
        // guards against a swap since then, so a disk with no stable ID (never proven by its
        // identity alone) counts as confirmed by it.
        let pv = PvState {
            name: name.to_string(),
            uid: key,
            host_path: host_path.to_string(),
            identity: Some(identity.to_string()),
            identity_confirmed: Some(identity.to_string()),
            ..Default::default()
        };
        self.spawn(pv, AfterWipe::Nothing, target, node);
    }

    fn spawn(&mut self, pv: PvState, after: AfterWipe, target: WipeTarget, regarding: ObjectReference) {
        if let Some(waiting) = self.awaiting.get(&pv.uid) {
            if waiting.confirmed == pv.identity_confirmed && Instant::now() < waiting.until {
                debug!(pv = %pv.name, "disk identity unproven and not confirmed (again); not wiping");
                return;
            }
            info!(pv = %pv.name, confirmed = ?pv.identity_confirmed, "checking the disk identity again");
        }
        let cancel = Arc::new(AtomicBool::new(false));
        self.running.insert(pv.uid.clone(), (cancel.clone(), pv.identity_confirmed.clone()));
        let task = WipeTask {
            cluster: self.cluster.clone(),
            opts: self.opts.clone(),
            permits: self.permits.clone(),
            metrics: self.metrics.clone(),
            ledger: self.ledger.clone(),
            regarding,
            pv,
            after,
            target,
            cancel,
            progress: Arc::new(AtomicU64::new(0)),
        };
        let tx = self.done_tx.clone();
        tokio::spawn(async move {
            let (uid, name) = (task.pv.uid.clone(), task.pv.name.clone());
            let result = task.run().await;
            let _ = tx.send(WipeOutcome { uid, name, result });
        });
    }

    /// Records a finished wipe; failures back off (longer for refusals) before a retry.
    pub fn finished(&mut self, outcome: &WipeOutcome) {
        let confirmed = self.running.remove(&outcome.uid).and_then(|(_, confirmed)| confirmed);
        if let Err(WipeError::IdentityUnproven { .. }) = &outcome.result {
            let backoff = match self.awaiting.get(&outcome.uid) {
                Some(last) => (last.backoff * 2).min(Duration::from_secs(1800)),
                None => Duration::from_secs(300),
            };
            let until = Instant::now() + backoff;
            self.awaiting.insert(outcome.uid.clone(), Awaiting { confirmed, until, backoff });
            self.backoff.remove(&outcome.uid);
            return;
        }
        self.awaiting.remove(&outcome.uid);
        if let Err(e) = &outcome.result {
            let base = if e.is_refusal() { Duration::from_secs(300) } else { Duration::from_secs(10) };
            let next = match self.backoff.get(&outcome.uid) {
                Some((_, last)) => (*last * 2).min(Duration::from_secs(1800)),
                None => base,
            };
            self.backoff.insert(outcome.uid.clone(), (Instant::now() + next, next));
        } else {
            self.backoff.remove(&outcome.uid);
        }
    }

    /// Forgets the backoff of a PV that changed (for example a new cleanup request).
    pub fn forget_backoff(&mut self, uid: &str) {
        self.backoff.remove(uid);
        self.awaiting.remove(uid);
    }

    /// Asks every running wipe to stop (shutdown). The PVs stay as they are; the wipes are
    /// done again from the start after the restart.
    pub fn cancel_all(&self) -> usize {
        for (c, _) in self.running.values() {
            c.store(true, Ordering::Relaxed);
        }
        self.running.len()
    }

    /// Number of wipes in flight.
    pub fn running(&self) -> usize {
        self.running.len()
    }
}

/// A PV whose wipe was refused for an unproven disk identity.
struct Awaiting {
    /// The confirmation annotation it was refused with.
    confirmed: Option<String>,
    /// When to check again even without a new confirmation (the disk may have been swapped).
    until: Instant,
    backoff: Duration,
}

struct WipeTask {
    cluster: Cluster,
    opts: CleanerOptions,
    permits: Arc<Semaphore>,
    metrics: Metrics,
    ledger: Ledger,
    /// What the wipe's events are about: the PV, or the Node for a wipe-first.
    regarding: ObjectReference,
    pv: PvState,
    after: AfterWipe,
    target: WipeTarget,
    cancel: Arc<AtomicBool>,
    /// Bytes done so far, for progress reports of block wipes.
    progress: Arc<AtomicU64>,
}

impl WipeTask {
    async fn run(self) -> Result<(), WipeError> {
        let _permit = self.permits.clone().acquire_owned().await.map_err(|e| WipeError::Failed(e.to_string()))?;
        let (name, path) = (self.pv.name.as_str(), self.target.path.clone());
        let reference = self.regarding.clone();
        let orphan = self.after == AfterWipe::Nothing;
        let started = Instant::now();
        // Until the entry is examined, the class's mode stands in for the metrics.
        let mut mode =
            if matches!(self.target.class.volume_mode, crate::config::VolumeMode::Block) { "block" } else { "fs" };
        let result = self.wipe(&mut mode).await;
        let elapsed = started.elapsed();
        match &result {
            Ok((mode, bytes)) => {
                self.metrics.wipe_finished(mode, true, elapsed, *bytes);
                info!(pv = name, path = %path.display(), mode, bytes, elapsed_ms = elapsed.as_millis() as u64, "volume wiped");
                let note = if orphan {
                    format!(
                        "Used volume at {} wiped before it is published as {name} ({bytes} bytes, {:.1}s)",
                        path.display(),
                        elapsed.as_secs_f64()
                    )
                } else {
                    format!("Volume at {} wiped ({bytes} bytes, {:.1}s)", path.display(), elapsed.as_secs_f64())
                };
                self.cluster.event(&reference, false, "VolumeCleaned", "Wipe", note).await;
            }
            Err(e) => {
                self.metrics.wipe_finished(mode, false, elapsed, 0);
                warn!(pv = name, path = %path.display(), error = %e, "wipe failed; the PV is left as it is");
                let note = if orphan {
                    event_note(format!(
                        "Error wiping the used volume at {} (to be published as {name:?}); it is not published: {e}",
                        path.display()
                    ))
                } else {
                    event_note(format!("Error cleaning PV {name:?}: {e}"))
                };
                self.cluster.event(&reference, true, "VolumeFailedDelete", "Wipe", note).await;
                if !orphan {
                    let result_ann = serde_json::json!({ ANN_CLEANUP_RESULT: format!("failed: {e}") });
                    let _ = self.cluster.patch_pv_metadata(name, None, serde_json::json!({}), result_ann, None).await;
                }
            }
        }
        result?;
        if orphan {
            info!(pv = name, path = %path.display(), "used volume wiped; discovery publishes it clean");
            return Ok(());
        }
        if self.after == AfterWipe::DeletePv {
            self.cluster.delete_pv(name, &self.pv.uid, None).await?;
        }
        self.cluster.remove_finalizer(name, &self.pv.uid, FINALIZER_WIPE).await?;
        info!(pv = name, "PV finished after wipe; discovery publishes the clean volume again");
        Ok(())
    }

    /// Checks identity, then wipes. Returns the mode ("fs" or "block") and the bytes wiped;
    /// `mode` is set as soon as the entry is known, for the metrics of a failure.
    async fn wipe(&self, mode: &mut &'static str) -> Result<(&'static str, u64), WipeError> {
        let path = self.target.path.clone();
        let failed = |e: &dyn std::fmt::Display| WipeError::Failed(e.to_string());
        let (pv, at) = (self.pv.clone(), path.clone());
        let checked = tokio::task::spawn_blocking(move || check_volume(&pv, &at))
            .await
            .map_err(|e| WipeError::Failed(format!("identity check task failed: {e}")))??;
        let reference = self.regarding.clone();
        match checked {
            Checked::Filesystem { root, size, .. } => {
                *mode = "fs";
                let note = format!("Starting cleanup of Filesystem PV {:?} at {}", self.pv.name, path.display());
                self.cluster.event(&reference, false, "VolumeDelete", "Wipe", note).await;
                let cancel = self.cancel.clone();
                let pv = self.pv.clone();
                let class = self.target.class.clone();
                let ledger = self.ledger.clone();
                let stats = self
                    .blocking(size, &path, move || {
                        let mounts = MountTable::read().map_err(|e| WipeError::Failed(e.to_string()))?;
                        // The identity is proven again on the descriptor the walk starts from:
                        // a mount swapped in at the path since the check above is caught.
                        let mut refusal = None;
                        // The descriptor and identity proven, kept to clear the used mark of
                        // exactly this disk once the wipe is complete.
                        let mut proven: Option<(std::os::fd::OwnedFd, String)> = None;
                        let mut verify = |fd: std::os::fd::BorrowedFd<'_>| {
                            // Never the host itself, whatever identity the PV recorded (or not).
                            if let Some(why) = mount_of_fd(fd, &mounts).and_then(|m| wipe_exposure(m, &mounts, &class))
                            {
                                let e = WipeError::Refused(format!("{} is not wiped: {why}", root.display()));
                                let text = e.to_string();
                                refusal = Some(e);
                                return Err(text);
                            }
                            let found = directory_identity(fd, &root, Some(&mounts)).map_err(|e| e.to_string())?;
                            let identity = found.identity.clone();
                            prove_identity(&pv, &root, found).map_err(|e| {
                                let text = e.to_string();
                                refusal = Some(e);
                                text
                            })?;
                            proven = Some((fd.try_clone_to_owned().map_err(|e| e.to_string())?, identity));
                            Ok(())
                        };
                        let result = wipe_filesystem_verified(&root, &mounts, &cancel, &mut verify);
                        let stats = result.map_err(|e| match e {
                            FsWipeError::NotTheVolume { .. } => {
                                refusal.take().unwrap_or(WipeError::Refused(e.to_string()))
                            }
                            FsWipeError::NestedMount { .. }
                            | FsWipeError::NotMounted { .. }
                            | FsWipeError::Immutable { .. } => WipeError::Refused(e.to_string()),
                            _ => WipeError::Failed(e.to_string()),
                        })?;
                        let Some((fd, identity)) = proven else {
                            return Err(WipeError::Failed("the wipe finished without proving the volume".into()));
                        };
                        let fd = std::os::fd::AsFd::as_fd(&fd);
                        let dir = mount_of_fd(fd, &mounts).map(|m| m.root.display().to_string());
                        clear_marks(&ledger, Some(fd), &root, &identity, dir.as_deref())?;
                        Ok(stats)
                    })
                    .await?;
                Ok(("fs", stats.bytes_freed))
            }
            Checked::Block { size, found } => {
                *mode = "block";
                let method = match (self.target.class.block_clean_method, &self.target.class.block_cleaner_command) {
                    (Some(m), _) => Ok(builtin(m)),
                    (None, cmd) if !cmd.is_empty() && Path::new(&cmd[0]).exists() => Err(cmd.clone()),
                    (None, cmd) => match cmd.first().and_then(|p| builtin_for_upstream_script(p)) {
                        Some(m) => Ok(m),
                        None => {
                            return Err(WipeError::Refused(format!(
                                "blockCleanerCommand {cmd:?} does not exist in this container and has no built-in equivalent; set blockCleanMethod or mount the script"
                            )));
                        }
                    },
                };
                let how = match &method {
                    Ok(m) => format!("built-in method {}", m.as_str()),
                    Err(cmd) => format!("command {cmd:?}"),
                };
                let note = format!("Starting cleanup of Block PV {:?} with {how}, this may take a while", self.pv.name);
                self.cluster.event(&reference, false, "VolumeDelete", "Wipe", note).await;
                match method {
                    Err(cmd) => {
                        let timeout = self.timeout(size);
                        run_cleaner_command(&cmd, &path, &self.pv.name, timeout).await.map_err(|e| failed(&e))?;
                        let (ledger, device) = (self.ledger.clone(), path.clone());
                        tokio::task::spawn_blocking(move || clear_marks(&ledger, None, &device, &found, None))
                            .await
                            .map_err(|e| WipeError::Failed(format!("clearing the used mark: {e}")))??;
                    }
                    Ok(m) => {
                        let cancel = self.cancel.clone();
                        let device = path.clone();
                        let done = self.progress.clone();
                        let pv = self.pv.clone();
                        let ledger = self.ledger.clone();
                        self.blocking(size, &path, move || {
                            // Proven again on the exclusively opened device the wipe writes
                            // through: a link or device swapped in since the check is caught.
                            let mut refusal = None;
                            let mut proven = None;
                            let mut verify = |file: &std::fs::File| {
                                let found = device_identity(file, &device).map_err(|e| e.to_string())?;
                                let identity = found.identity.clone();
                                prove_identity(&pv, &device, found).map_err(|e| {
                                    let text = e.to_string();
                                    refusal = Some(e);
                                    text
                                })?;
                                proven = Some(identity);
                                Ok(())
                            };
                            let mut progress = |d, _| done.store(d, Ordering::Relaxed);
                            wipe_block_verified(&device, m, &cancel, &mut progress, &mut verify).map_err(
                                |e| match e {
                                    BlockWipeError::NotTheDisk { .. } => {
                                        refusal.take().unwrap_or(WipeError::Refused(e.to_string()))
                                    }
                                    _ => WipeError::Failed(e.to_string()),
                                },
                            )?;
                            let identity = proven.unwrap_or(found);
                            clear_marks(&ledger, None, &device, &identity, None)
                        })
                        .await?;
                    }
                }
                Ok(("block", size))
            }
        }
    }

    fn timeout(&self, size: u64) -> Duration {
        self.opts.timeout_base + Duration::from_secs(size / self.opts.min_rate.max(1))
    }

    /// Runs blocking wipe code on the blocking pool with the size-scaled timeout, logging
    /// progress every 10 seconds and posting an event every 5 minutes for long wipes.
    async fn blocking<T: Send + 'static>(
        &self,
        size: u64,
        path: &Path,
        f: impl FnOnce() -> Result<T, WipeError> + Send + 'static,
    ) -> Result<T, WipeError> {
        let timeout = self.timeout(size);
        let started = Instant::now();
        let mut handle = tokio::task::spawn_blocking(f);
        let mut tick = tokio::time::interval(Duration::from_secs(10));
        tick.tick().await;
        let mut ticks = 0u64;
        let mut timed_out = false;
        loop {
            tokio::select! {
                joined = &mut handle => {
                    return match joined {
                        Ok(Ok(v)) => Ok(v),
                        Ok(Err(_)) if timed_out => Err(WipeError::TimedOut { path: path.to_path_buf(), after: timeout }),
                        Ok(Err(e)) => Err(e),
                        Err(e) => Err(WipeError::Failed(format!("wipe task failed: {e}"))),
                    };
                }
                _ = tick.tick() => {
                    ticks += 1;
                    let done = self.progress.load(Ordering::Relaxed);
                    let pct = if size > 0 && done > 0 {
                        format!(" ({}%)", done.saturating_mul(100) / size)
                    } else {
                        String::new()
                    };
                    let elapsed_s = started.elapsed().as_secs();
                    info!(pv = %self.pv.name, path = %path.display(), elapsed_s, "still wiping{pct}");
                    if ticks.is_multiple_of(30) {
                        let note = format!("Still wiping {} after {elapsed_s}s{pct}", path.display());
                        self.cluster.event(&pv_reference(&self.pv.name), false, "VolumeWipeProgress", "Wipe", note).await;
                    }
                    if started.elapsed() >= timeout && !timed_out {
                        timed_out = true;
                        self.cancel.store(true, Ordering::Relaxed);
                    }
                }
            }
        }
    }
}

fn builtin(m: BlockCleanMethod) -> BlockMethod {
    match m {
        BlockCleanMethod::Quick => BlockMethod::Quick,
        BlockCleanMethod::Discard => BlockMethod::Discard,
        BlockCleanMethod::Zero => BlockMethod::Zero,
    }
}

/// The API refuses an Event whose note is over 1 KiB, and the event would be lost: longer notes
/// are cut (the full text is in the PV's cleanup-result annotation).
fn event_note(mut note: String) -> String {
    const LIMIT: usize = 1024;
    const CUT: &str = " [...]";
    if note.len() > LIMIT {
        let mut end = LIMIT - CUT.len();
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push_str(CUT);
    }
    note
}

/// What the wipe found at the volume's path, after the identity check.
enum Checked {
    /// A mounted filesystem: its root (canonical parent + entry name) and size in bytes.
    Filesystem { root: PathBuf, size: u64 },
    /// A block device (the path, or a symlink to it), its size in bytes and the identity
    /// proven (the ledger entry a completed wipe clears).
    Block { size: u64, found: String },
}

/// The blocking part of a wipe's preparation: what the entry is (a symlink is followed only to
/// a block device), whether the disk there is the recorded one, and its size.
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
/// core::used_mark::wiped_by). Until both are gone the wipe counts as failed and is done again.
fn clear_marks(
    ledger: &Ledger,
    root: Option<std::os::fd::BorrowedFd<'_>>,
    path: &Path,
    identity: &str,
    dir: Option<&str>,
) -> Result<(), WipeError> {
    let failed = |e: crate::host::used_mark::MarkError| WipeError::Failed(format!("wiped, but {e}"));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_notes_fit_the_api_limit() {
        assert_eq!(event_note("short".into()), "short");
        let exact = "x".repeat(1024);
        assert_eq!(event_note(exact.clone()), exact);
        let long = format!("{}\u{e9}{}", "a".repeat(1017), "b".repeat(100));
        let cut = event_note(long);
        assert!(cut.len() <= 1024 && cut.ends_with(" [...]"), "{}", cut.len());
    }

    #[test]
    fn unproven_refusals_say_what_to_check_and_the_command() {
        let e = WipeError::IdentityUnproven {
            host_path: "/mnt/disks/vol1".into(),
            pv: "local-pv-1a2b3c4d".into(),
            recorded: "v2;fs;uuid=u;ino=2;dev=252:1".into(),
            found: "v2;fs;uuid=u;ino=2;dev=252:2".into(),
            reason: "the device has no stable ID".into(),
        };
        let text = e.to_string();
        assert!(text.contains("/mnt/disks/vol1: the device has no stable ID"), "{text}");
        assert!(text.contains("kubectl annotate pv local-pv-1a2b3c4d --overwrite local-static-provisioner.io/identity-confirmed='v2;fs;uuid=u;ino=2;dev=252:2'"), "{text}");
        assert!(e.is_refusal());
    }
}

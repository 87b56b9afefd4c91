//! One wipe in the background: waits for a permit, has the host wipe the volume (on the
//! blocking pool, under a timeout that scales with the size), reports progress, and finishes
//! the PV only after the wipe succeeded.
//!
//! Requests per released PV are kept to what a decision or an operator needs: the PV's
//! delete and the removal of our finalizer (its position read from the watch's store, not
//! asked again), then discovery's create of the clean volume, whose annotation tells the wipe
//! (core::wipe::wipe_history: the new PV's own history, in the create). A wipe that ends within
//! [`PROGRESS_EVERY`] is told in the log and the metrics only; a longer one is announced with
//! an Event when it passes that time, and its end with another, so whoever saw it start sees it
//! end. Failures are always Events (and the PV's cleanup-result annotation).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{info, warn};

use super::{History, Progress, WIPE_STALL, WipeError, WipeJob, Wiped};
use crate::api::{AnnotationPatch, Cluster, pv_reference};
use crate::core::volumes::naming::{ANN_CLEANUP_RESULT, FINALIZER_WIPE};
use crate::core::wipe::cleanup::AfterWipe;
use crate::core::wipe::wipe_history::LastWipe;
use crate::host::access::HostAccess;
use crate::host::ops::{Operations, Subject};
use crate::metrics::{FinishedWipe, Metrics};

/// How often a long wipe logs its progress; every 30th report is also an Event.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);
/// How often the wipe's progress is looked at, to extend its deadline (host::ops).
const STALL_CHECK_EVERY: Duration = Duration::from_secs(1);

pub(super) struct WipeTask {
    pub cluster: Cluster,
    pub host: Arc<dyn HostAccess>,
    pub ops: Operations,
    pub permits: Arc<Semaphore>,
    pub metrics: Metrics,
    /// What the wipe's events are about: the PV, or the Node for a wipe-first.
    pub regarding: ObjectReference,
    pub job: WipeJob,
    pub after: AfterWipe,
    pub cancel: Arc<AtomicBool>,
    pub progress: Arc<Progress>,
    /// The volumes' last wipes, shared with the cleaner (core::wipe::wipe_history).
    pub history: History,
    /// Whether the wipe was announced with an Event (a long one, or a wipe-first).
    pub announced: AtomicBool,
    /// A test's injected fault: the task panics once the wipe is done.
    #[cfg(test)]
    pub panic_after_wipe: bool,
}

impl WipeTask {
    pub(super) async fn run(self) -> Result<(), WipeError> {
        let permit = self.permits.clone().acquire_owned().await.map_err(|e| WipeError::Failed(e.to_string()))?;
        let _running = self.metrics.wipe_running();
        let name = self.job.pv.name.as_str();
        let path = self.job.target.path.clone();
        let orphan = self.after == AfterWipe::Nothing;
        let started = Instant::now();
        let block = matches!(self.job.target.class.volume_mode, crate::config::VolumeMode::Block);
        if orphan {
            // About the Node, and not per released PV: a used disk found with no PV.
            self.announce().await;
        }
        let result = self.wipe(permit).await;
        #[cfg(test)]
        if self.panic_after_wipe && result.is_ok() {
            panic!("injected by a test after the wipe of {name}");
        }
        let elapsed = started.elapsed();
        let finished = |mode, ok, bytes_wiped| FinishedWipe {
            mode,
            ok,
            elapsed,
            bytes_wiped,
            capacity_bytes: self.progress.size.load(Ordering::Relaxed),
            cleanup_command: self.job.target.class.block_cleaner_command.first().map_or("", String::as_str),
        };
        match &result {
            Ok(Wiped { resumed: true, .. }) => {
                info!(pv = name, path = %path.display(), "wiped before, unchanged since: finishing the PV");
            }
            Ok(Wiped { mode, bytes, key_erased, .. }) => {
                self.metrics.wipe_finished(&finished(mode, true, *bytes));
                if key_erased.is_some() {
                    self.metrics.crypto_erased();
                }
                info!(pv = name, path = %path.display(), mode, bytes, elapsed_ms = elapsed.as_millis() as u64, "volume wiped");
                let secs = elapsed.as_secs_f64();
                let note = if orphan {
                    format!(
                        "Used volume at {} wiped before it is published as {name} ({bytes} bytes, {secs:.1}s)",
                        path.display()
                    )
                } else {
                    format!("Volume at {} wiped ({bytes} bytes, {secs:.1}s)", path.display())
                };
                if self.announced.load(Ordering::Relaxed) {
                    self.cluster.event(&self.regarding, false, "VolumeCleaned", "Wipe", note).await;
                }
            }
            Err(e @ WipeError::InUse { .. }) => {
                // Not a failed wipe (no metric, no failure annotation): a wait, said once per try.
                info!(pv = name, path = %path.display(), reason = %e, "wipe waits for kubelet to unmount the volume");
                let note = format!("Not wiped yet: {e}");
                self.cluster.event(&self.regarding, false, "VolumeStillMounted", "Wipe", note).await;
            }
            Err(e) => {
                if matches!(e, WipeError::KeyNotDestroyed(_)) {
                    self.metrics.key_failed("destroy");
                }
                // Until the entry is examined, the class's mode stands in for the metrics.
                self.metrics.wipe_finished(&finished(if block { "block" } else { "fs" }, false, 0));
                warn!(pv = name, path = %path.display(), error = %e, "wipe failed; the PV is left as it is");
                let note = if orphan {
                    format!(
                        "Error wiping the used volume at {} (to be published as {name:?}); it is not published: {e}",
                        path.display()
                    )
                } else {
                    format!("Error cleaning PV {name:?}: {e}")
                };
                self.cluster.event(&self.regarding, true, "VolumeFailedDelete", "Wipe", note).await;
                if !orphan {
                    let result = AnnotationPatch::new().set(ANN_CLEANUP_RESULT, format!("failed: {e}"));
                    if let Err(e) = self.cluster.patch_annotations(name, None, &result).await {
                        warn!(pv = name, error = %e, "recording the failed wipe on the PV failed");
                    }
                }
            }
        }
        let wiped = result?;
        if orphan {
            info!(pv = name, path = %path.display(), "used volume wiped; discovery publishes it clean");
            return Ok(());
        }
        let uid = self.job.pv.uid.as_str();
        // Before the PV goes: the pass its deletion wakes may publish the volume at once.
        self.keep_history(wiped, elapsed).await;
        if let Err(e) = self.finish(name, uid).await {
            let e = WipeError::from(e);
            warn!(pv = name, error = %e, "wiped, but the PV could not be finished; retried (not wiped again while its record holds)");
            let note = format!("Error cleaning PV {name:?}: the volume is wiped, but {e}");
            self.cluster.event(&self.regarding, true, "VolumeFailedDelete", "Wipe", note).await;
            return Err(e);
        }
        info!(pv = name, "PV finished after wipe; discovery publishes the clean volume again");
        // The record of the completed wipe has served its purpose.
        let (host, key) = (self.host.clone(), uid.to_string());
        let forgot = tokio::task::spawn_blocking(move || host.forget_wipes(&|u| u != key)).await;
        if let Ok(Err(e)) = forgot {
            warn!(pv = name, error = %e, "could not drop the completed wipe's record; dropped at the next start");
        }
        Ok(())
    }

    /// Keeps the wipe as the volume's history for its next PV (core::wipe::wipe_history): durably
    /// (a restart before that PV exists keeps it) and in the cleaner's memory.
    async fn keep_history(&self, wiped: Wiped, elapsed: Duration) {
        let last = LastWipe {
            host_path: self.job.pv.host_path.clone(),
            identity: wiped.identity,
            at: wiped.at,
            method: wiped.method,
            bytes: wiped.bytes,
            elapsed_ms: (!wiped.resumed).then(|| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)),
            pv: self.job.pv.name.clone(),
            pv_uid: self.job.pv.uid.clone(),
            key_erased: wiped.key_erased,
            earlier: self.job.pv.wipe_history.clone(),
        };
        let (host, noted) = (self.host.clone(), last.clone());
        match tokio::task::spawn_blocking(move || host.note_last_wipe(&noted)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(pv = %last.pv, error = %e, "could not keep the volume's history on the node"),
            Err(e) => warn!(pv = %last.pv, error = %e, "the task keeping the volume's history failed"),
        }
        self.history.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(last.host_path.clone(), last);
    }

    /// Deletes the PV (when asked) and drops our finalizer.
    async fn finish(&self, name: &str, uid: &str) -> Result<(), crate::api::ApiError> {
        if self.after == AfterWipe::DeletePv {
            self.cluster.delete_pv(name, uid, None).await?;
        }
        self.cluster.remove_finalizer(name, uid, FINALIZER_WIPE).await
    }

    /// Tells, once, that the wipe started (a long one, or a wipe-first).
    async fn announce(&self) {
        if self.announced.swap(true, Ordering::Relaxed) {
            return;
        }
        let name = self.job.pv.name.as_str();
        let path = self.job.target.path.display();
        let note = format!("Starting cleanup of PV {name:?} at {path}, this may take a while");
        self.cluster.event(&self.regarding, false, "VolumeDelete", "Wipe", note).await;
    }

    /// Runs the host's wipe on the pool of per-volume operations (host::ops) with the
    /// size-scaled timeout (cancelling it when the time is up), logging progress every 10
    /// seconds and posting an event every 5 minutes for long wipes. A wipe that shows no
    /// progress for [`WIPE_STALL`] makes its volume unresponsive and gives `permit` back, so the
    /// node's other wipes go on; at its timeout it is given up on without waiting for it.
    async fn wipe(&self, permit: OwnedSemaphorePermit) -> Result<Wiped, WipeError> {
        let subject = Subject::Volume(self.job.pv.host_path.clone());
        // Its filesystem, from the mount table: a wipe stuck on it refuses its neighbours at once.
        let domain = self.host.mount_table().ok().and_then(|m| m.domain_of(&self.job.target.path));
        let (ticket, _) =
            self.ops.begin(&subject, domain, "wipe", WIPE_STALL).map_err(|e| WipeError::Unresponsive(e.to_string()))?;
        let watch = ticket.watch();
        let (host, job, cancel, progress) =
            (self.host.clone(), self.job.clone(), self.cancel.clone(), self.progress.clone());
        let mut handle = self.ops.start(ticket, move |on| host.wipe(&job, &cancel, &progress, on));
        let path = self.job.target.path.clone();
        let started = Instant::now();
        let mut tick = tokio::time::interval(STALL_CHECK_EVERY);
        tick.tick().await;
        let mut permit = Some(permit);
        let (mut last_beat, mut last_log, mut logged) = (self.beat(), Instant::now(), 0u64);
        let mut timed_out = None;
        loop {
            tokio::select! {
                joined = &mut handle => {
                    return match joined {
                        Ok(Ok(v)) => Ok(v),
                        Ok(Err(_)) if timed_out.is_some() => {
                            Err(WipeError::TimedOut { path, after: timed_out.unwrap_or_default() })
                        }
                        Ok(Err(e)) => Err(e),
                        Err(e) => Err(WipeError::Failed(format!("wipe task failed: {e}"))),
                    };
                }
                _ = tick.tick() => {
                    let beat = self.beat();
                    if beat != last_beat {
                        last_beat = beat;
                        watch.extend(WIPE_STALL);
                    }
                    if permit.is_some() && watch.overdue() {
                        permit = None;
                        let note = format!(
                            "the wipe of {} has made no progress for {}s: the disk does not answer (a frozen \
                             filesystem, a hung device). The other wipes go on; this one is left to finish or \
                             time out, and is retried once the volume answers again",
                            path.display(),
                            WIPE_STALL.as_secs()
                        );
                        warn!(pv = %self.job.pv.name, path = %path.display(), "{note}");
                        self.cluster.event(&self.regarding, true, "VolumeUnresponsive", "Wipe", note).await;
                    }
                    if last_log.elapsed() >= PROGRESS_EVERY {
                        last_log = Instant::now();
                        logged += 1;
                        self.log_progress(&path, started, logged).await;
                    }
                    let timeout = self.job.timeout_for(self.progress.total.load(Ordering::Relaxed));
                    if started.elapsed() >= timeout && timed_out.is_none() {
                        timed_out = Some(timeout);
                        self.cancel.store(true, Ordering::Relaxed);
                    }
                    // A cancelled wipe stuck in the kernel is not waited for: its volume stays
                    // unresponsive (no other operation starts on it) until it returns.
                    if let Some(after) = timed_out.filter(|_| watch.overdue()) {
                        return Err(WipeError::TimedOut { path, after });
                    }
                }
            }
        }
    }

    /// The wipe's progress counters, as one number that grows while it works.
    fn beat(&self) -> u64 {
        self.progress.done.load(Ordering::Relaxed).wrapping_add(self.progress.beats.load(Ordering::Relaxed))
    }

    /// Logs how far the wipe is; the `n`th report, every 30th also as an event.
    async fn log_progress(&self, path: &std::path::Path, started: Instant, n: u64) {
        let size = self.progress.total.load(Ordering::Relaxed);
        let done = self.progress.done.load(Ordering::Relaxed);
        let pct = if size > 0 && done > 0 { format!(" ({}%)", done.saturating_mul(100) / size) } else { String::new() };
        let elapsed_s = started.elapsed().as_secs();
        info!(pv = %self.job.pv.name, path = %path.display(), elapsed_s, "still wiping{pct}");
        self.announce().await;
        if n.is_multiple_of(30) {
            let note = format!("Still wiping {} after {elapsed_s}s{pct}", path.display());
            let pv = pv_reference(&self.job.pv.name, Some(&self.job.pv.uid));
            self.cluster.event(&pv, false, "VolumeWipeProgress", "Wipe", note).await;
        }
    }
}

//! The wiper: runs the wipes the cleanup planner asks for, each in the background with a
//! concurrency limit and a timeout that scales with the volume's size, and finishes the PV
//! (delete it, or drop our finalizer) only after the wipe succeeded. Before wiping, the host
//! side proves that the path still holds the very disk that was published
//! (core::identity::disk_identity): a disk proven to be another is never wiped, and one that cannot be
//! proven the same waits for an operator's confirmation of exactly the identity found.
//!
//! Every failure is kept as a retry record (core::reconcile::backoff) until the wipe succeeds: failures
//! retry after 10 s, doubling to 30 min; refusals (an operator must act) after 5 min. A new
//! cleanup request or identity confirmation on the PV retries at once.

mod task;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use tokio::sync::{Semaphore, mpsc};

use crate::api::{Cluster, pv_reference};
use crate::config::ClassConfig;
use crate::core::reconcile::backoff::Policy;
use crate::core::reconcile::effect_key::EffectKey;
use crate::core::wipe::cleanup::{AfterWipe, PvState};
use crate::core::wipe::wipe_history::LastWipe;
use crate::host::access::HostAccess;
use crate::host::ops::Operations;
use crate::metrics::Metrics;
use crate::runtime::effects::Effects;

pub use crate::core::wipe::wipe_job::{Progress, WIPE_STALL, WipeError, WipeJob, WipeTarget, Wiped};

impl From<crate::api::ApiError> for WipeError {
    fn from(e: crate::api::ApiError) -> Self {
        WipeError::Api(Box::new(e))
    }
}

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

/// Locates a PV's volume inside this container through its class (core::volumes::pv::container_path).
pub fn target_for(pv: &PvState, class: Option<&ClassConfig>) -> Result<WipeTarget, String> {
    target_at(&pv.host_path, &pv.class, class)
}

/// Locates the volume at `host_path` of class `class_name` (configured as `class`) inside this
/// container, for a volume that has no PV yet.
pub fn target_at(host_path: &str, class_name: &str, class: Option<&ClassConfig>) -> Result<WipeTarget, String> {
    let class =
        class.ok_or_else(|| format!("StorageClass {class_name:?} is not in the config; cannot locate its volume"))?;
    let path = crate::core::volumes::pv::container_path(host_path, &class.host_dir, &class.mount_dir)?;
    Ok(WipeTarget { path, class: class.clone() })
}

/// The result of one wipe task, fed back to the reconcile loop.
#[derive(Debug)]
pub struct WipeOutcome {
    /// The wipe's key: `Wipe(PV UID)` or `WipeFirst(host path)`.
    pub key: EffectKey,
    /// PV name.
    pub name: String,
    /// What happened.
    pub result: Result<(), WipeError>,
}

/// The last completed wipe of each volume whose new PV does not exist yet, by host path
/// (core::wipe::wipe_history), shared by the cleaner and its wipe tasks: a task adds its wipe before
/// it deletes the PV, since the pass that deletion wakes may publish the volume at once.
pub(crate) type History = Arc<std::sync::Mutex<BTreeMap<String, LastWipe>>>;

/// Delays after a failed wipe: an I/O error or a timeout may pass soon.
const FAILED: Policy = Policy { initial: Duration::from_secs(10), max: Duration::from_secs(1800) };
/// Delays while kubelet still has the volume mounted for a pod: it lets go within the pod's
/// grace period, and each check is one read of the mount table.
const IN_USE: Policy = Policy { initial: Duration::from_secs(2), max: Duration::from_secs(60) };
/// Delays after a refusal (identity, nested mount, immutable file): an operator must act, and
/// their new request or confirmation retries at once.
const REFUSED: Policy = Policy { initial: Duration::from_secs(300), max: Duration::from_secs(1800) };

/// What a PV's wipe is asked with: a new cleanup request or a new identity confirmation
/// retries a failed wipe at once instead of waiting out its delay.
pub fn ask_of(pv: &PvState) -> String {
    format!(
        "request={}; confirmed={}",
        pv.cleanup_requested_at.as_deref().unwrap_or(""),
        pv.identity_confirmed.as_deref().unwrap_or("")
    )
}

/// What the planners must leave alone this pass (Cleaner::busy).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Busy {
    /// UIDs of PVs being wiped, or waiting out a failed wipe's delay.
    pub pvs: BTreeSet<String>,
    /// Host paths of used disks being wiped before they are published again (or waiting out a
    /// failed wipe-first's delay).
    pub paths: BTreeSet<String>,
}

/// Tracks running wipes and failures waiting for a retry.
pub struct Cleaner {
    cluster: Cluster,
    host: Arc<dyn HostAccess>,
    opts: CleanerOptions,
    permits: Arc<Semaphore>,
    /// Wipes in flight: their cancel flag and what they were asked with.
    running: BTreeMap<EffectKey, (Arc<AtomicBool>, String)>,
    /// Failed wipes, kept until one succeeds or the PV needs none: the same executor's
    /// bookkeeping as the agent's other effects.
    retries: Effects,
    done_tx: mpsc::UnboundedSender<WipeOutcome>,
    metrics: Metrics,
    /// Where the wipes run, one per volume, under their progress deadline (host::ops).
    ops: Operations,
    /// PV UIDs that may have a completed-wipe record (host::wipe::wipe_record): pruned once their PV is
    /// gone or needs no wipe.
    recorded: BTreeSet<String>,
    /// The volumes' last wipes (kept durably by the host too), dropped once published or too
    /// old.
    history: History,
    /// A test's injected fault: the next wipe task panics after its wipe.
    #[cfg(test)]
    pub(crate) panic_next: AtomicBool,
}

impl Cleaner {
    /// A cleaner whose finished wipes are reported on the returned channel. Its wipes run on
    /// `ops`, the executor shared with the agent's other host operations (a volume whose scan or
    /// mark is stuck is not wiped meanwhile, and the other way round): taken here, not set
    /// afterwards, since a cleaner that made its own would be a second pool nobody sees.
    pub fn new(
        cluster: Cluster,
        host: Arc<dyn HostAccess>,
        ops: Operations,
        opts: CleanerOptions,
        metrics: Metrics,
    ) -> (Self, mpsc::UnboundedReceiver<WipeOutcome>) {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let permits = Arc::new(Semaphore::new(opts.concurrency.max(1)));
        // Read once at start (a small file); pruned by `retain` from the first pass on.
        let recorded = match host.forget_wipes(&|_| true) {
            Ok(uids) => uids.into_iter().collect(),
            Err(e) => {
                tracing::warn!(error = %e, "completed wipes cannot be read; their PVs are wiped again");
                BTreeSet::new()
            }
        };
        let now = k8s_openapi::jiff::Timestamp::now();
        let history = match host.last_wipes(&|w| w.fresh_at(now)) {
            Ok(wipes) => Arc::new(std::sync::Mutex::new(wipes.into_iter().map(|w| (w.host_path.clone(), w)).collect())),
            Err(e) => {
                tracing::warn!(error = %e, "the volumes' last wipes cannot be read; their new PVs will not tell them");
                History::default()
            }
        };
        let cleaner = Cleaner {
            history,
            cluster,
            host,
            opts,
            permits,
            running: BTreeMap::new(),
            retries: Effects::default(),
            ops,
            done_tx,
            metrics,
            recorded,
            #[cfg(test)]
            panic_next: AtomicBool::new(false),
        };
        (cleaner, done_rx)
    }

    /// What the planners must leave alone: wiping now, or waiting out the delay after a failure
    /// that nothing since asks to retry. `pvs` are this node's PVs, whose current ask (request,
    /// confirmation) is compared with the failure's.
    pub fn busy(&self, pvs: &[PvState]) -> Busy {
        let asks: BTreeMap<&str, String> = if self.retries.no_failures() {
            BTreeMap::new()
        } else {
            pvs.iter().map(|pv| (pv.uid.as_str(), ask_of(pv))).collect()
        };
        // A wipe-first, or a PV not among `pvs`, has no new ask to compare.
        let waiting = self.retries.failed_keys().filter(|key| {
            let new_ask = match key {
                EffectKey::Wipe(uid) => asks.get(uid.as_str()).map(String::as_str),
                _ => None,
            };
            let ask = new_ask.or_else(|| self.retries.failure(key)?.asked.as_deref());
            !self.retries.may_try(key, ask)
        });
        let mut busy = Busy::default();
        for key in self.running.keys().chain(waiting) {
            match key {
                EffectKey::Wipe(uid) => busy.pvs.insert(uid.clone()),
                EffectKey::WipeFirst(path) => busy.paths.insert(path.clone()),
                _ => false,
            };
        }
        busy
    }

    /// When the next failed wipe may be retried, so the loop wakes up for it.
    pub fn next_retry(&self) -> Option<Instant> {
        self.retries.next_due()
    }

    /// Forgets failures of keys no longer wanted (their PV is gone or needs no wipe), so the
    /// records do not outlive what they were about.
    pub fn retain(&mut self, wanted: impl Fn(&EffectKey) -> bool) {
        self.retries.retain(|k| wanted(k));
        // Last wipes too old to be told (their volume never came back).
        self.forget_history(BTreeSet::new());
        let stale: BTreeSet<String> = self
            .recorded
            .iter()
            .filter(|uid| {
                let key = EffectKey::Wipe(uid.to_string());
                !wanted(&key) && !self.running.contains_key(&key)
            })
            .cloned()
            .collect();
        if stale.is_empty() {
            return;
        }
        self.recorded.retain(|k| !stale.contains(k));
        let host = self.host.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = host.forget_wipes(&|uid| !stale.contains(uid)) {
                tracing::warn!(error = %e, "could not prune the records of completed wipes");
            }
        });
    }

    /// Starts wiping a PV's volume in the background.
    pub fn start(&mut self, pv: PvState, after: AfterWipe, target: WipeTarget) {
        let regarding = pv_reference(&pv.name, Some(&pv.uid));
        self.spawn(EffectKey::Wipe(pv.uid.clone()), pv, after, target, regarding);
    }

    /// Wipes a used disk that no PV names any more (its used mark is set, its PV is gone),
    /// before discovery publishes it as `name`: the same identity proof on the wipe's own
    /// descriptor, then the mark is cleared. Events go to `node`. Keyed by its host path
    /// (`Busy::paths`).
    pub fn start_wipe_first(
        &mut self,
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
            // No PV yet: nothing is finished or recorded after this wipe (AfterWipe::Nothing).
            uid: String::new(),
            host_path: host_path.to_string(),
            identity: Some(identity.to_string()),
            identity_confirmed: Some(identity.to_string()),
            ..Default::default()
        };
        let key = EffectKey::WipeFirst(host_path.to_string());
        self.spawn(key, pv, AfterWipe::Nothing, target, node);
    }

    fn spawn(&mut self, key: EffectKey, pv: PvState, after: AfterWipe, target: WipeTarget, regarding: ObjectReference) {
        if self.running.contains_key(&key) {
            return;
        }
        if let Some(failed) = self.retries.failure(&key) {
            tracing::info!(pv = %pv.name, confirmed = ?pv.identity_confirmed, failures = failed.failures, last_error = %failed.error, "retrying the wipe; checking the disk identity again");
        }
        let cancel = Arc::new(AtomicBool::new(false));
        self.running.insert(key.clone(), (cancel.clone(), ask_of(&pv)));
        let resumable = after != AfterWipe::Nothing;
        let job = WipeJob { pv, target, timeout_base: self.opts.timeout_base, min_rate: self.opts.min_rate, resumable };
        let task = task::WipeTask {
            cluster: self.cluster.clone(),
            host: self.host.clone(),
            ops: self.ops.clone(),
            permits: self.permits.clone(),
            metrics: self.metrics.clone(),
            regarding,
            job,
            after,
            cancel,
            progress: Arc::new(Progress::default()),
            announced: AtomicBool::new(false),
            history: self.history.clone(),
            #[cfg(test)]
            panic_after_wipe: self.panic_next.swap(false, Ordering::Relaxed),
        };
        let tx = self.done_tx.clone();
        tokio::spawn(async move {
            let name = task.job.pv.name.clone();
            let (cluster, regarding) = (task.cluster.clone(), task.regarding.clone());
            // The wipe runs as a task of its own, so a panic in it still ends in an outcome:
            // the failure is kept with its backoff and retried, never left "running" for ever.
            let result = match tokio::spawn(task.run()).await {
                Ok(result) => result,
                Err(e) => {
                    let e = WipeError::Failed(format!("the wipe task {}", join_failure(e)));
                    tracing::error!(pv = %name, error = %e, "wipe task ended without a result; retried later");
                    let note = format!("Error cleaning PV {name:?}: {e}");
                    cluster.event(&regarding, true, "VolumeFailedDelete", "Wipe", note).await;
                    Err(e)
                }
            };
            let _ = tx.send(WipeOutcome { key, name, result });
        });
    }

    /// Records a finished wipe: a failure is kept with its retry deadline (longer for
    /// refusals), a success forgets earlier failures.
    pub fn finished(&mut self, outcome: &WipeOutcome) {
        let ask = self.running.remove(&outcome.key).map(|(_, ask)| ask);
        let uid = match &outcome.key {
            EffectKey::Wipe(uid) => Some(uid),
            _ => None,
        };
        match &outcome.result {
            Ok(()) => {
                self.retries.succeeded(&outcome.key);
                if let Some(uid) = uid {
                    self.recorded.remove(uid);
                }
            }
            Err(e) => {
                // The wipe may have completed and been recorded before what failed.
                if let Some(uid) = uid {
                    self.recorded.insert(uid.clone());
                }
                let policy = match e {
                    WipeError::InUse { .. } => IN_USE,
                    e if e.is_refusal() => REFUSED,
                    _ => FAILED,
                };
                let due = self.retries.failed_with(&outcome.key, policy, e.to_string(), ask.as_deref());
                let in_s = due.saturating_duration_since(Instant::now()).as_secs();
                tracing::info!(pv = %outcome.name, retry_in_s = in_s, error = %e, "wipe will be retried");
            }
        }
    }

    /// The last wipe of the volume at `host_path` when the disk found there (`identity`) is
    /// the one wiped: its new PV tells it.
    pub fn last_wipe_for(&self, host_path: &str, identity: &str) -> Option<LastWipe> {
        let history = self.history.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        history.get(host_path).filter(|w| w.applies_to(host_path, identity)).cloned()
    }

    /// Forgets the last wipes of `host_paths` (their new PVs exist, or the disk there is
    /// another one) and those too old to be told, durably in the background.
    pub fn forget_history(&mut self, host_paths: BTreeSet<String>) {
        let now = k8s_openapi::jiff::Timestamp::now();
        {
            let mut history = self.history.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let before = history.len();
            history.retain(|path, w| !host_paths.contains(path) && w.fresh_at(now));
            if history.len() == before {
                return;
            }
        }
        let host = self.host.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = host.last_wipes(&|w| !host_paths.contains(&w.host_path) && w.fresh_at(now)) {
                tracing::warn!(error = %e, "could not drop the volumes' last wipes");
            }
        });
    }

    /// The failure kept for `key`, if any (for tests and logs).
    pub fn failure(&self, key: &EffectKey) -> Option<&crate::core::reconcile::backoff::Record> {
        self.retries.failure(key)
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

/// What a wipe task that ended without a result did: panicked (with its message), or was
/// cancelled by the runtime shutting down.
fn join_failure(e: tokio::task::JoinError) -> String {
    if !e.is_panic() {
        return format!("was cancelled: {e}");
    }
    let payload = e.into_panic();
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_string());
    format!("panicked: {text}")
}

#[cfg(test)]
mod tests {
    use super::*;

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

#[cfg(test)]
#[path = "cleaner_tests.rs"]
mod cleaner_tests;

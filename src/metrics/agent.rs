//! The agent's metrics, family group by family group: what its passes published, device
//! claims, wipes, the passes themselves and the volumes' health, each registered by its own
//! small function, and the agent's calls that record them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::{GO_DEFAULT_BUCKETS, Metrics, ModeLabels, upstream_mode};

/// What the passes published: the discovery duration, the capacity, this node's PVs by
/// phase and those flagged for an operator.
pub(super) struct Published {
    discovery_duration: Family<ModeLabels, Histogram>,
    capacity_bytes: Family<ModeLabels, Gauge>,
    /// Capacity of the PVs created in the current pass, filesystem and block: set into
    /// `capacity_bytes` when the pass ends.
    pass_capacity: [AtomicU64; 2],
    volumes: Family<StateLabels, Gauge>,
    flagged: Family<FlagLabels, Gauge>,
}

impl Published {
    /// The families, registered in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let group = Published {
            discovery_duration: Family::new_with_constructor(|| Histogram::new(GO_DEFAULT_BUCKETS)),
            capacity_bytes: Family::default(),
            pass_capacity: [AtomicU64::new(0), AtomicU64::new(0)],
            volumes: Family::default(),
            flagged: Family::default(),
        };
        registry.register(
            "local_volume_provisioner_persistentvolume_discovery_duration_seconds",
            "Duration of a discovery pass (upstream name; mode is always \"all\" here: one pass covers every class)",
            group.discovery_duration.clone(),
        );
        registry.register(
            "local_volume_provisioner_persistentvolume_capacity_bytes",
            "Capacity in bytes of the volumes published in the last discovery pass, by mode (upstream name and type; both modes set every pass)",
            group.capacity_bytes.clone(),
        );
        registry.register("local_static_provisioner_volumes", "This node's PVs by phase", group.volumes.clone());
        registry.register(
            "local_static_provisioner_flagged_volumes",
            "This node's PVs that need an operator, by flag: missing (a bound PV's disk is gone), stale (the disk of a PV of an earlier incarnation of the Node is gone), moved (its disk is at another entry)",
            group.flagged.clone(),
        );
        group
    }
}

/// Raw device claims (a class's `devices` section) and full reads.
pub(super) struct Claims {
    device_claims: Family<ClassLabels, Gauge>,
    device_claims_total: Family<ClassLabels, Counter>,
    devices_refused: Family<ClassReasonLabels, Gauge>,
    claims_withdrawn: Family<ClassLabels, Counter>,
    full_read_done: Family<DeviceLabels, Gauge>,
    full_read_total: Family<DeviceLabels, Gauge>,
    full_reads: Family<ResultLabels, Counter>,
}

impl Claims {
    /// The families, registered in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let group = Claims {
            device_claims: Family::default(),
            device_claims_total: Family::default(),
            devices_refused: Family::default(),
            claims_withdrawn: Family::default(),
            full_read_done: Family::default(),
            full_read_total: Family::default(),
            full_reads: Family::default(),
        };
        registry.register(
            "local_static_provisioner_claimed_devices",
            "Raw devices this agent keeps linked into each class's discovery directory (its devices section)",
            group.device_claims.clone(),
        );
        registry.register(
            "local_static_provisioner_device_claims",
            "Raw devices linked into a class's discovery directory by this agent",
            group.device_claims_total.clone(),
        );
        registry.register(
            "local_static_provisioner_devices_refused",
            "Devices a class's filter selects that the last pass refused to claim, by reason (not blank, in use, partitioned...)",
            group.devices_refused.clone(),
        );
        registry.register(
            "local_static_provisioner_claims_withdrawn",
            "Unbound PVs of claimed devices withdrawn because something the agent did not put there showed up on the device (a signature, a mount, a writer); the device is held until it proves blank and unused again",
            group.claims_withdrawn.clone(),
        );
        registry.register(
            "local_static_provisioner_full_read_done_bytes",
            "Bytes read so far by the full read under way (verify: full), by device",
            group.full_read_done.clone(),
        );
        registry.register(
            "local_static_provisioner_full_read_size_bytes",
            "Size of the device the full read under way (verify: full) reads, by device",
            group.full_read_total.clone(),
        );
        registry.register(
            "local_static_provisioner_full_reads",
            "Full reads (verify: full) finished since the agent started, by result: blank, data, voided (the device was written during the read), failed",
            group.full_reads.clone(),
        );
        group
    }
}

/// Wipes: upstream's delete metrics, the running ones, bytes wiped.
pub(super) struct Wipes {
    delete_total: Family<DeleteLabels, Counter>,
    delete_failed_total: Family<DeleteLabels, Counter>,
    delete_duration: Family<DeleteDurationLabels, Histogram>,
    wipes_running: Gauge,
    wipe_bytes: Family<ModeLabels, Counter>,
    crypto_erases: Counter,
    key_failures: Family<OpLabels, Counter>,
}

impl Wipes {
    /// The families, registered in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let group = Wipes {
            delete_total: Family::default(),
            delete_failed_total: Family::default(),
            delete_duration: Family::new_with_constructor(|| Histogram::new(GO_DEFAULT_BUCKETS)),
            wipes_running: Gauge::default(),
            wipe_bytes: Family::default(),
            crypto_erases: Counter::default(),
            key_failures: Family::default(),
        };
        registry.register(
            "local_volume_provisioner_persistentvolume_delete",
            "Volumes wiped and their PVs finished (upstream name)",
            group.delete_total.clone(),
        );
        registry.register(
            "local_volume_provisioner_persistentvolume_delete_failed",
            "Wipes that failed or were refused (upstream name)",
            group.delete_failed_total.clone(),
        );
        registry.register(
            "local_volume_provisioner_persistentvolume_delete_duration_seconds",
            "Duration of successful wipes (upstream name and labels: capacity rounded up to 500G steps, the class's blockCleanerCommand)",
            group.delete_duration.clone(),
        );
        registry.register(
            "local_volume_provisioner_proctable_running",
            "Wipes running now (upstream name: its table of cleanup processes)",
            group.wipes_running.clone(),
        );
        registry.register("local_static_provisioner_wipe_bytes", "Bytes wiped", group.wipe_bytes.clone());
        registry.register(
            "local_static_provisioner_crypto_erases",
            "Encrypted volumes whose key a wipe destroyed (removed from the kernel, shown absent, its stored copy destroyed) before removing their files (docs/encryption.md)",
            group.crypto_erases.clone(),
        );
        registry.register(
            "local_static_provisioner_encryption_key_failures",
            "Failed steps of encrypted volumes' keys, by operation: prepare (a new volume's key and directory), load (a key into the kernel; the PV is fenced), destroy (a wipe's key destruction; retried), orphan (a key no PV names)",
            group.key_failures.clone(),
        );
        group
    }
}

/// The reconcile passes: PVs created, their duration, the config in use, succession
/// decisions, entries left unpublished.
pub(super) struct Passes {
    discovery_total: Family<ModeLabels, Counter>,
    pass_duration: Histogram,
    config_valid: Gauge,
    succession: Family<OutcomeLabels, Counter>,
    unpublished: Family<ReasonLabels, Gauge>,
    held_disks: Family<ReasonLabels, Gauge>,
}

impl Passes {
    /// The families, registered in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let group = Passes {
            discovery_total: Family::default(),
            pass_duration: Histogram::new(exponential_buckets(0.001, 4.0, 10)),
            config_valid: Gauge::default(),
            succession: Family::default(),
            unpublished: Family::default(),
            held_disks: Family::default(),
        };
        registry.register(
            "local_volume_provisioner_persistentvolume_discovery",
            "PVs created by discovery (upstream name)",
            group.discovery_total.clone(),
        );
        registry.register(
            "local_static_provisioner_reconcile_duration_seconds",
            "Duration of a reconcile pass (scan, plan, execute)",
            group.pass_duration.clone(),
        );
        registry.register(
            "local_static_provisioner_config_valid",
            "1 when the configuration in use is the one on disk, 0 when the last change was refused",
            group.config_valid.clone(),
        );
        registry.register(
            "local_static_provisioner_succession",
            "PVs of an earlier incarnation of this Node (same name, other UID): readopted, withdrawn, flagged stale or unverified",
            group.succession.clone(),
        );
        registry.register(
            "local_static_provisioner_unpublished_entries",
            "Entries of the discovery directories not published in the last pass, by reason (symlink, exposes-host, same-disk, device-in-use, ...)",
            group.unpublished.clone(),
        );
        registry.register(
            "local_static_provisioner_held_disks",
            "Block disks held back at the last look because another node's PV or used-disk record names them, by reason (claimed-pv, unclaimed-pv, record)",
            group.held_disks.clone(),
        );
        group
    }
}

/// Volumes that do not answer, stuck host operations, fences and failing disks.
pub(super) struct Health {
    unresponsive: Family<StallLabels, Gauge>,
    operations_stuck: Gauge,
    wedged_threads: Gauge,
    wedged_cap_reached: Gauge,
    fenced: Family<FenceLabels, Gauge>,
    failing: Family<FailingLabels, Gauge>,
    watch_degraded: Family<KindLabels, Gauge>,
}

impl Health {
    /// The families, registered in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let group = Health {
            unresponsive: Family::default(),
            operations_stuck: Gauge::default(),
            wedged_threads: Gauge::default(),
            wedged_cap_reached: Gauge::default(),
            fenced: Family::default(),
            failing: Family::default(),
            watch_degraded: Family::default(),
        };
        registry.register(
            "local_static_provisioner_volume_unresponsive",
            "1 for each volume, device or discovery directory whose host operation passed its deadline and has not answered in time since (it keeps its last known state)",
            group.unresponsive.clone(),
        );
        registry.register(
            "local_static_provisioner_host_operations_stuck",
            "Host operations past their deadline whose threads have not returned (threads wedged disks hold; at most one per volume and kind of operation)",
            group.operations_stuck.clone(),
        );
        registry.register(
            "local_static_provisioner_wedged_threads",
            "Threads of the host-operation pool held by operations that do not answer (past their deadline, or slow and left by their callers); they do not count against the threads that serve answering volumes. One per wedged filesystem, not per volume on it",
            group.wedged_threads.clone(),
        );
        registry.register(
            "local_static_provisioner_wedged_threads_cap_reached",
            "1 when the held threads reached their cap (512): the pool adds no thread for more, and only volumes seen answering before get new host operations until some return",
            group.wedged_cap_reached.clone(),
        );
        registry.register(
            "local_static_provisioner_fenced_volumes",
            "1 for each PV of this node no pod may newly mount, and why: not-its-disk (its path holds another disk), disk-missing (nothing at its path), unverified (its disk has not answered since the agent started)",
            group.fenced.clone(),
        );
        registry.register(
            "local_static_provisioner_volume_failing",
            "1 for each volume and sign of a failing disk (unresponsive, read-only, filesystem-errors, shut-down, io-errors, io-failure)",
            group.failing.clone(),
        );
        registry.register(
            "local_static_provisioner_watch_degraded",
            "1 while the agent lacks inotify, by kind: instances (fs.inotify.max_user_instances reached) or watches (fs.inotify.max_user_watches reached); changes are then found by the periodic resync",
            group.watch_degraded.clone(),
        );
        group
    }
}

impl Metrics {
    /// Counts a wipe as running until the returned guard is dropped (whatever way it ends).
    pub fn wipe_running(&self) -> WipeRunning {
        self.inner.wipes.wipes_running.inc();
        WipeRunning { gauge: self.inner.wipes.wipes_running.clone() }
    }

    /// Records one finished wipe: counted as upstream counts a deletion, its duration only
    /// when it succeeded (as upstream). `capacity_bytes` is the PV's, `cleanup_command` the
    /// class's first blockCleanerCommand word ("" without one).
    pub fn wipe_finished(&self, wipe: &FinishedWipe<'_>) {
        let mode = upstream_mode(wipe.mode);
        let labels = DeleteLabels { mode: mode.clone(), r#type: "process".into() };
        if wipe.ok {
            self.inner.wipes.delete_total.get_or_create(&labels).inc();
            self.inner.wipes.wipe_bytes.get_or_create(&ModeLabels { mode: mode.clone() }).inc_by(wipe.bytes_wiped);
            let duration_labels = DeleteDurationLabels {
                mode,
                r#type: "process".into(),
                capacity: capacity_breakdown(wipe.capacity_bytes),
                cleanup_command: wipe.cleanup_command.to_string(),
            };
            self.inner.wipes.delete_duration.get_or_create(&duration_labels).observe(wipe.elapsed.as_secs_f64());
        } else {
            self.inner.wipes.delete_failed_total.get_or_create(&labels).inc();
        }
    }

    /// Records one PV created by discovery; its capacity counts in this pass's
    /// `persistentvolume_capacity_bytes`.
    pub fn pv_created(&self, mode: &str, capacity_bytes: u64) {
        let mode = upstream_mode(mode);
        let slot = usize::from(mode == "Block");
        self.inner.published.pass_capacity[slot].fetch_add(capacity_bytes, Ordering::Relaxed);
        self.inner.passes.discovery_total.get_or_create(&ModeLabels { mode }).inc();
    }

    /// Records the duration of one reconcile pass and of its discovery part, and sets the
    /// capacity published in the pass (both modes, 0 when none: upstream sets both each pass).
    pub fn pass_done(&self, elapsed: Duration, discovery: Duration) {
        self.inner.passes.pass_duration.observe(elapsed.as_secs_f64());
        let labels = ModeLabels { mode: "all".into() };
        self.inner.published.discovery_duration.get_or_create(&labels).observe(discovery.as_secs_f64());
        for (slot, mode) in ["Filesystem", "Block"].into_iter().enumerate() {
            let bytes = self.inner.published.pass_capacity[slot].swap(0, Ordering::Relaxed);
            let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
            self.inner.published.capacity_bytes.get_or_create(&ModeLabels { mode: mode.into() }).set(bytes);
        }
    }

    /// Sets the number of this node's PVs per phase (phases not listed drop to zero).
    pub fn set_volumes(&self, by_phase: &std::collections::BTreeMap<String, i64>) {
        for phase in ["Available", "Bound", "Released", "Failed", "Pending"] {
            let n = by_phase.get(phase).copied().unwrap_or(0);
            self.inner.published.volumes.get_or_create(&StateLabels { state: phase.to_string() }).set(n);
        }
    }

    /// Sets how many of this node's PVs carry each flag an operator must act on (missing,
    /// stale, moved): the state behind the VolumeMissing / VolumeStale / VolumeMoved events,
    /// so an alert can say it still holds. Every flag is set, zero when none.
    pub fn set_flagged(&self, missing: i64, stale: i64, moved: i64) {
        for (flag, n) in [("missing", missing), ("stale", stale), ("moved", moved)] {
            self.inner.published.flagged.get_or_create(&FlagLabels { flag: flag.to_string() }).set(n);
        }
    }

    /// Sets the device claim figures of the last pass: links kept per class, and devices
    /// refused per class and reason (every class with a devices section is set, zero when none).
    pub fn set_device_claims(
        &self,
        kept: &std::collections::BTreeMap<String, i64>,
        refused: &std::collections::BTreeMap<(String, &'static str), i64>,
    ) {
        self.inner.claims.device_claims.clear();
        for (class, n) in kept {
            self.inner.claims.device_claims.get_or_create(&ClassLabels { class: class.clone() }).set(*n);
        }
        self.inner.claims.devices_refused.clear();
        for ((class, reason), n) in refused {
            let labels = ClassReasonLabels { class: class.clone(), reason: reason.to_string() };
            self.inner.claims.devices_refused.get_or_create(&labels).set(*n);
        }
    }

    /// Counts one encrypted volume's key destroyed by its wipe.
    pub fn crypto_erased(&self) {
        self.inner.wipes.crypto_erases.inc();
    }

    /// Counts one failed step `op` of an encryption key (prepare, load, destroy, orphan).
    pub fn key_failed(&self, op: &str) {
        self.inner.wipes.key_failures.get_or_create(&OpLabels { op: op.to_string() }).inc();
    }

    /// Counts one unbound PV of a claimed device of `class` withdrawn for foreign use.
    pub fn claim_withdrawn(&self, class: &str) {
        self.inner.claims.claims_withdrawn.get_or_create(&ClassLabels { class: class.to_string() }).inc();
    }

    /// Sets the full read figures: the read under way (device, stable id, bytes done and in
    /// all; none cleared), and the finished reads by result since start (a running total).
    pub fn set_full_reads(
        &self,
        running: Option<(&str, &str, u64, u64)>,
        results: &std::collections::BTreeMap<&'static str, u64>,
    ) {
        self.inner.claims.full_read_done.clear();
        self.inner.claims.full_read_total.clear();
        if let Some((device, disk, done, total)) = running {
            let labels = DeviceLabels { device: device.to_string(), disk: disk.to_string() };
            self.inner.claims.full_read_done.get_or_create(&labels).set(i64::try_from(done).unwrap_or(i64::MAX));
            self.inner.claims.full_read_total.get_or_create(&labels).set(i64::try_from(total).unwrap_or(i64::MAX));
        }
        for (result, n) in results {
            let counter = self.inner.claims.full_reads.get_or_create(&ResultLabels { result: result.to_string() });
            counter.inc_by(n.saturating_sub(counter.get()));
        }
    }

    /// Counts one device linked for `class`.
    pub fn device_claimed(&self, class: &str) {
        self.inner.claims.device_claims_total.get_or_create(&ClassLabels { class: class.to_string() }).inc();
    }

    /// Sets how many entries the last pass did not publish, per reason; reasons absent from
    /// `by_reason` are removed, so the gauge shows the current state, not history.
    pub fn set_unpublished(&self, by_reason: &std::collections::BTreeMap<&'static str, i64>) {
        self.inner.passes.unpublished.clear();
        for (reason, n) in by_reason {
            self.inner.passes.unpublished.get_or_create(&ReasonLabels { reason: reason.to_string() }).set(*n);
        }
    }

    /// Sets how many block disks another node's PV or record holds back, per reason
    /// (core::identity::disk_trust); reasons absent from `by_reason` are removed.
    pub fn set_held_disks(&self, by_reason: &std::collections::BTreeMap<&'static str, i64>) {
        self.inner.passes.held_disks.clear();
        for (reason, n) in by_reason {
            self.inner.passes.held_disks.get_or_create(&ReasonLabels { reason: reason.to_string() }).set(*n);
        }
    }

    /// The unresponsive subjects (path, operation) and the operations stuck now.
    pub fn set_unresponsive(&self, stalls: &[(String, String)], stuck: usize) {
        self.inner.health.unresponsive.clear();
        for (path, operation) in stalls {
            let labels = StallLabels { path: path.clone(), operation: operation.clone() };
            self.inner.health.unresponsive.get_or_create(&labels).set(1);
        }
        self.inner.health.operations_stuck.set(stuck as i64);
    }

    /// Whether the agent lacks inotify instances or watches (core::mounts::inotify::Shortage).
    pub fn set_watch_degraded(&self, instances: bool, watches: bool) {
        for (kind, short) in [("instances", instances), ("watches", watches)] {
            self.inner
                .health
                .watch_degraded
                .get_or_create(&KindLabels { kind: kind.to_string() })
                .set(i64::from(short));
        }
    }

    /// The threads held by host operations that do not answer, and whether they reached their cap.
    pub fn set_wedged(&self, threads: usize, cap_reached: bool) {
        self.inner.health.wedged_threads.set(threads as i64);
        self.inner.health.wedged_cap_reached.set(i64::from(cap_reached));
    }

    /// The fences in force on this node: (PV name, reason).
    pub fn set_fenced(&self, fenced: &[(String, &'static str)]) {
        self.inner.health.fenced.clear();
        for (pv, reason) in fenced {
            self.inner.health.fenced.get_or_create(&FenceLabels { pv: pv.clone(), reason: reason.to_string() }).set(1);
        }
    }

    /// The failing signs of this node's volumes: (path, PV name or "", reason code).
    pub fn set_failing(&self, failing: &[(String, String, String)]) {
        self.inner.health.failing.clear();
        for (path, pv, reason) in failing {
            let labels = FailingLabels { path: path.clone(), pv: pv.clone(), reason: reason.clone() };
            self.inner.health.failing.get_or_create(&labels).set(1);
        }
    }

    /// Records whether the configuration on disk is the one in use.
    pub fn set_config_valid(&self, valid: bool) {
        self.inner.passes.config_valid.set(i64::from(valid));
    }

    /// Records a succession decision of the agent (readopted, withdrawn, flagged_stale, unverified).
    pub fn succession(&self, outcome: &str) {
        self.inner.passes.succession.get_or_create(&OutcomeLabels { outcome: outcome.to_string() }).inc();
    }
}

/// One finished wipe, as [`Metrics::wipe_finished`] records it.
#[derive(Debug, Clone, Copy)]
pub struct FinishedWipe<'a> {
    /// "fs" or "block".
    pub mode: &'a str,
    /// Whether the wipe succeeded.
    pub ok: bool,
    /// How long it took.
    pub elapsed: Duration,
    /// Bytes written or discarded.
    pub bytes_wiped: u64,
    /// The PV's capacity (upstream's `capacity` label).
    pub capacity_bytes: u64,
    /// The class's first blockCleanerCommand word, "" without one.
    pub cleanup_command: &'a str,
}

/// A running wipe in `local_volume_provisioner_proctable_running`, until dropped.
#[derive(Debug)]
pub struct WipeRunning {
    gauge: Gauge,
}

impl Drop for WipeRunning {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// Upstream's `capacity` label of the delete duration: the capacity rounded up to a multiple
/// of 500 GiB, as "0G", "500G", "1000G"... (its metrics.CapacityBreakDown).
pub(super) fn capacity_breakdown(capacity_bytes: u64) -> String {
    const STEP: u64 = 500 * 1024 * 1024 * 1024;
    format!("{}G", capacity_bytes.div_ceil(STEP) * 500)
}

/// Labels of upstream's delete duration: mode, type, capacity bucket and the class's first
/// blockCleanerCommand word ("" without one).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeleteDurationLabels {
    mode: String,
    r#type: String,
    capacity: String,
    cleanup_command: String,
}

/// Labels of upstream's delete metrics: `mode` (fs or block) and `type` (always "process":
/// wipes run in the agent, never in Jobs).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeleteLabels {
    mode: String,
    r#type: String,
}

/// Outcome of a succession decision about a PV of an earlier incarnation of the node.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

/// A volume (or device, or discovery directory) that does not answer, and the operation that
/// passed its deadline.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StallLabels {
    path: String,
    operation: String,
}

/// A PV whose volume is fenced (core::fence::volume_fence) and why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FenceLabels {
    pv: String,
    reason: String,
}

/// A volume whose disk shows a sign of failing, its PV (if any) and the sign.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailingLabels {
    path: String,
    pv: String,
    reason: String,
}

/// What the agent lacks of inotify: instances or watches.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

/// An encryption key operation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: String,
}

/// Why entries of the discovery directories are not published.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

/// A class whose devices are claimed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabels {
    class: String,
}

/// A class and why devices its filter selects are refused.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassReasonLabels {
    class: String,
    reason: String,
}

/// A device being read whole (`verify: full`): kernel name and stable id.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeviceLabels {
    device: String,
    disk: String,
}

/// How a full read ended: blank, data, voided (written during the read) or failed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

/// PVs of this node by phase.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

/// This node's PVs flagged for an operator, by flag.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FlagLabels {
    flag: String,
}

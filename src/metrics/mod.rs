//! Prometheus metrics. Upstream's metrics keep their names, types, labels and label values
//! (pkg/metrics of the Go provisioner and of its node-cleanup), and the standard `process_*`
//! metrics its Go client exposed, so existing dashboards and alerts keep working after the
//! image swap; ours are added under `local_static_provisioner_`. docs/operations.md and
//! docs/node-cleanup.md list them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// client_golang's `prometheus.DefBuckets`, which upstream's histograms use: dashboards that
/// pick a bucket (`le="1"`) find the same ones.
const GO_DEFAULT_BUCKETS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Upstream's `mode` label values are Kubernetes volume modes ("Filesystem", "Block"); the
/// agent's callers say "fs" and "block".
fn upstream_mode(mode: &str) -> String {
    match mode {
        "fs" => "Filesystem".into(),
        "block" => "Block".into(),
        other => other.into(),
    }
}

/// Upstream's `capacity` label of the delete duration: the capacity rounded up to a multiple
/// of 500 GiB, as "0G", "500G", "1000G"... (its metrics.CapacityBreakDown).
fn capacity_breakdown(capacity_bytes: u64) -> String {
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

/// Labels of upstream node-cleanup's PV delete counters: the PV's phase.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: String,
}

/// Labels of the build-info metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    commit: String,
    build_date: String,
    rustc: String,
    target: String,
}

/// Labels of upstream's delete metrics: `mode` (fs or block) and `type` (always "process":
/// wipes run in the agent, never in Jobs).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeleteLabels {
    mode: String,
    r#type: String,
}

/// Labels with only a volume mode.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModeLabels {
    mode: String,
}

/// All metrics of the agent, cheap to clone and share between tasks.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    delete_total: Family<DeleteLabels, Counter>,
    delete_failed_total: Family<DeleteLabels, Counter>,
    delete_duration: Family<DeleteDurationLabels, Histogram>,
    wipes_running: Gauge,
    wipe_bytes: Family<ModeLabels, Counter>,
    discovery_total: Family<ModeLabels, Counter>,
    pass_duration: Histogram,
    discovery_duration: Family<ModeLabels, Histogram>,
    capacity_bytes: Family<ModeLabels, Gauge>,
    /// Capacity of the PVs created in the current pass, filesystem and block: set into
    /// `capacity_bytes` when the pass ends.
    pass_capacity: [AtomicU64; 2],
    volumes: Family<StateLabels, Gauge>,
    flagged: Family<FlagLabels, Gauge>,
    device_claims: Family<ClassLabels, Gauge>,
    device_claims_total: Family<ClassLabels, Counter>,
    devices_refused: Family<ClassReasonLabels, Gauge>,
    claims_withdrawn: Family<ClassLabels, Counter>,
    full_read_done: Family<DeviceLabels, Gauge>,
    full_read_total: Family<DeviceLabels, Gauge>,
    full_reads: Family<ResultLabels, Counter>,
    config_valid: Gauge,
    api_requests: Family<MethodLabels, Counter>,
    api_requests_failed: Family<MethodLabels, Counter>,
    api_duration: Family<MethodLabels, Histogram>,
    succession: Family<OutcomeLabels, Counter>,
    unpublished: Family<ReasonLabels, Gauge>,
    unresponsive: Family<StallLabels, Gauge>,
    operations_stuck: Gauge,
    failing: Family<FailingLabels, Gauge>,
    fenced: Family<FenceLabels, Gauge>,
    cleanup_actions: Family<ActionLabels, Counter>,
    cleanup_failures: Family<ActionLabels, Counter>,
    gone_nodes: Gauge,
    leader: Gauge,
    nodes_unreadable: Counter,
    cleanup_pv_deleted: Family<PhaseLabels, Counter>,
    cleanup_pv_delete_failed: Family<PhaseLabels, Counter>,
    cleanup_claim_deleted: Counter,
    cleanup_claim_delete_failed: Counter,
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

/// A PV whose volume is fenced (core::fence) and why.
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

/// What node-cleanup did and why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    action: String,
    cause: String,
}

/// Which process the metrics belong to: each exposes only its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The per-node agent.
    Agent,
    /// The node-cleanup Deployment.
    NodeCleanup,
}

/// Labels of upstream's API request metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: String,
}

/// PVs of this node by phase.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FlagLabels {
    flag: String,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// The agent's metrics.
    pub fn new() -> Self {
        Self::for_role(Role::Agent)
    }

    /// Registers the metrics of `role` (API request metrics are common to both).
    pub fn for_role(role: Role) -> Self {
        let mut registry = Registry::default();
        let delete_total = Family::<DeleteLabels, Counter>::default();
        let delete_failed_total = Family::<DeleteLabels, Counter>::default();
        let delete_duration =
            Family::<DeleteDurationLabels, Histogram>::new_with_constructor(|| Histogram::new(GO_DEFAULT_BUCKETS));
        let wipe_bytes = Family::<ModeLabels, Counter>::default();
        let discovery_total = Family::<ModeLabels, Counter>::default();
        let pass_duration = Histogram::new(exponential_buckets(0.001, 4.0, 10));
        let config_valid = Gauge::default();
        let discovery_duration =
            Family::<ModeLabels, Histogram>::new_with_constructor(|| Histogram::new(GO_DEFAULT_BUCKETS));
        let capacity_bytes = Family::<ModeLabels, Gauge>::default();
        let volumes = Family::<StateLabels, Gauge>::default();
        let flagged = Family::<FlagLabels, Gauge>::default();
        let device_claims = Family::<ClassLabels, Gauge>::default();
        let device_claims_total = Family::<ClassLabels, Counter>::default();
        let devices_refused = Family::<ClassReasonLabels, Gauge>::default();
        let claims_withdrawn = Family::<ClassLabels, Counter>::default();
        let full_read_done = Family::<DeviceLabels, Gauge>::default();
        let full_read_total = Family::<DeviceLabels, Gauge>::default();
        let full_reads = Family::<ResultLabels, Counter>::default();
        let api_requests = Family::<MethodLabels, Counter>::default();
        let api_requests_failed = Family::<MethodLabels, Counter>::default();
        let api_duration =
            Family::<MethodLabels, Histogram>::new_with_constructor(|| Histogram::new(GO_DEFAULT_BUCKETS));
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels {
                version: crate::build_info::VERSION.into(),
                commit: crate::build_info::GIT_COMMIT.into(),
                build_date: crate::build_info::BUILD_DATE.into(),
                rustc: crate::build_info::RUSTC_VERSION.into(),
                target: crate::build_info::TARGET.into(),
            })
            .set(1);
        registry.register(
            "local_static_provisioner_build_info",
            "Always 1; the labels say which version, git commit, build date, rustc and target run",
            build_info,
        );
        registry.register_collector(Box::new(ProcessCollector));
        registry.register(
            "local_volume_provisioner_apiserver_requests",
            "API requests made by the agent, watches excluded (upstream name)",
            api_requests.clone(),
        );
        registry.register(
            "local_volume_provisioner_apiserver_requests_failed",
            "API requests that failed (upstream name)",
            api_requests_failed.clone(),
        );
        registry.register(
            "local_volume_provisioner_apiserver_requests_duration_seconds",
            "Duration of API requests (upstream name)",
            api_duration.clone(),
        );
        // Each process exposes only its own metrics; the other role's go to a registry nobody reads.
        let mut unused = Registry::default();
        let (agent_registry, cleanup_registry) = match role {
            Role::Agent => (&mut registry, &mut unused),
            Role::NodeCleanup => (&mut unused, &mut registry),
        };
        agent_registry.register(
            "local_volume_provisioner_persistentvolume_discovery_duration_seconds",
            "Duration of a discovery pass (upstream name; mode is always \"all\" here: one pass covers every class)",
            discovery_duration.clone(),
        );
        agent_registry.register(
            "local_volume_provisioner_persistentvolume_capacity_bytes",
            "Capacity in bytes of the volumes published in the last discovery pass, by mode (upstream name and type; both modes set every pass)",
            capacity_bytes.clone(),
        );
        agent_registry.register("local_static_provisioner_volumes", "This node's PVs by phase", volumes.clone());
        agent_registry.register(
            "local_static_provisioner_flagged_volumes",
            "This node's PVs that need an operator, by flag: missing (a bound PV's disk is gone), stale (the disk of a PV of an earlier incarnation of the Node is gone), moved (its disk is at another entry)",
            flagged.clone(),
        );
        agent_registry.register(
            "local_static_provisioner_claimed_devices",
            "Raw devices this agent keeps linked into each class's discovery directory (its devices section)",
            device_claims.clone(),
        );
        agent_registry.register(
            "local_static_provisioner_device_claims",
            "Raw devices linked into a class's discovery directory by this agent",
            device_claims_total.clone(),
        );
        agent_registry.register(
            "local_static_provisioner_devices_refused",
            "Devices a class's filter selects that the last pass refused to claim, by reason (not blank, in use, partitioned...)",
            devices_refused.clone(),
        );
        agent_registry.register(
            "local_static_provisioner_claims_withdrawn",
            "Unbound PVs of claimed devices withdrawn because something the agent did not put there showed up on the device (a signature, a mount, a writer); the device is held until it proves blank and unused again",
            claims_withdrawn.clone(),
        );
        agent_registry.register(
            "local_static_provisioner_full_read_done_bytes",
            "Bytes read so far by the full read under way (verify: full), by device",
            full_read_done.clone(),
        );
        agent_registry.register(
            "local_static_provisioner_full_read_size_bytes",
            "Size of the device the full read under way (verify: full) reads, by device",
            full_read_total.clone(),
        );
        agent_registry.register(
            "local_static_provisioner_full_reads",
            "Full reads (verify: full) finished since the agent started, by result: blank, data, voided (the device was written during the read), failed",
            full_reads.clone(),
        );
        agent_registry.register(
            "local_volume_provisioner_persistentvolume_delete",
            "Volumes wiped and their PVs finished (upstream name)",
            delete_total.clone(),
        );
        agent_registry.register(
            "local_volume_provisioner_persistentvolume_delete_failed",
            "Wipes that failed or were refused (upstream name)",
            delete_failed_total.clone(),
        );
        agent_registry.register(
            "local_volume_provisioner_persistentvolume_delete_duration_seconds",
            "Duration of successful wipes (upstream name and labels: capacity rounded up to 500G steps, the class's blockCleanerCommand)",
            delete_duration.clone(),
        );
        let wipes_running = Gauge::default();
        agent_registry.register(
            "local_volume_provisioner_proctable_running",
            "Wipes running now (upstream name: its table of cleanup processes)",
            wipes_running.clone(),
        );
        agent_registry.register("local_static_provisioner_wipe_bytes", "Bytes wiped", wipe_bytes.clone());
        agent_registry.register(
            "local_volume_provisioner_persistentvolume_discovery",
            "PVs created by discovery (upstream name)",
            discovery_total.clone(),
        );
        agent_registry.register(
            "local_static_provisioner_reconcile_duration_seconds",
            "Duration of a reconcile pass (scan, plan, execute)",
            pass_duration.clone(),
        );
        agent_registry.register(
            "local_static_provisioner_config_valid",
            "1 when the configuration in use is the one on disk, 0 when the last change was refused",
            config_valid.clone(),
        );
        let succession = Family::<OutcomeLabels, Counter>::default();
        agent_registry.register(
            "local_static_provisioner_succession",
            "PVs of an earlier incarnation of this Node (same name, other UID): readopted, withdrawn, flagged stale or unverified",
            succession.clone(),
        );
        let unpublished = Family::<ReasonLabels, Gauge>::default();
        agent_registry.register(
            "local_static_provisioner_unpublished_entries",
            "Entries of the discovery directories not published in the last pass, by reason (symlink, exposes-host, same-disk, device-in-use, ...)",
            unpublished.clone(),
        );
        let unresponsive = Family::<StallLabels, Gauge>::default();
        agent_registry.register(
            "local_static_provisioner_volume_unresponsive",
            "1 for each volume, device or discovery directory whose host operation passed its deadline and has not answered in time since (it keeps its last known state)",
            unresponsive.clone(),
        );
        let operations_stuck = Gauge::default();
        agent_registry.register(
            "local_static_provisioner_host_operations_stuck",
            "Host operations past their deadline whose threads have not returned (threads wedged disks hold; at most one per volume and kind of operation)",
            operations_stuck.clone(),
        );
        let failing = Family::<FailingLabels, Gauge>::default();
        let fenced = Family::<FenceLabels, Gauge>::default();
        agent_registry.register(
            "local_static_provisioner_fenced_volumes",
            "1 for each PV of this node no pod may newly mount, and why: not-its-disk (its path holds another disk), disk-missing (nothing at its path), unverified (its disk has not answered since the agent started)",
            fenced.clone(),
        );
        agent_registry.register(
            "local_static_provisioner_volume_failing",
            "1 for each volume and sign of a failing disk (unresponsive, read-only, filesystem-errors, shut-down, io-errors, io-failure)",
            failing.clone(),
        );
        let cleanup_actions = Family::<ActionLabels, Counter>::default();
        let cleanup_failures = Family::<ActionLabels, Counter>::default();
        let gone_nodes = Gauge::default();
        let leader = Gauge::default();
        let nodes_unreadable = Counter::default();
        let cleanup_pv_deleted = Family::<PhaseLabels, Counter>::default();
        let cleanup_pv_delete_failed = Family::<PhaseLabels, Counter>::default();
        let cleanup_claim_deleted = Counter::default();
        let cleanup_claim_delete_failed = Counter::default();
        cleanup_registry.register(
            "local_volume_node_cleanup_persistentvolume_delete",
            "PVs deleted by node-cleanup, by phase (upstream name)",
            cleanup_pv_deleted.clone(),
        );
        cleanup_registry.register(
            "local_volume_node_cleanup_persistentvolume_delete_failed",
            "PV deletions by node-cleanup that failed, by phase (upstream name)",
            cleanup_pv_delete_failed.clone(),
        );
        cleanup_registry.register(
            "local_volume_node_cleanup_persistentvolumeclaim_delete",
            "Claims deleted by node-cleanup (upstream name)",
            cleanup_claim_deleted.clone(),
        );
        cleanup_registry.register(
            "local_volume_node_cleanup_persistentvolumeclaim_delete_failed",
            "Claim deletions by node-cleanup that failed (upstream name)",
            cleanup_claim_delete_failed.clone(),
        );
        cleanup_registry.register(
            "local_static_provisioner_node_cleanup_actions",
            "Claims deleted, PVs deleted and finalizers released by node-cleanup, by cause (node_gone, stale)",
            cleanup_actions.clone(),
        );
        cleanup_registry.register(
            "local_static_provisioner_node_cleanup_failures",
            "node-cleanup actions that failed (retried on the next pass)",
            cleanup_failures.clone(),
        );
        cleanup_registry.register(
            "local_static_provisioner_node_cleanup_absent_nodes",
            "Nodes named by opted-in local PVs that do not exist (within or past the grace period)",
            gone_nodes.clone(),
        );
        cleanup_registry.register(
            "local_static_provisioner_node_cleanup_leader",
            "1 while this replica holds the leader Lease",
            leader.clone(),
        );
        cleanup_registry.register(
            "local_static_provisioner_node_cleanup_nodes_unreadable",
            "Passes skipped because Nodes could not be listed (nothing is done without them)",
            nodes_unreadable.clone(),
        );
        Metrics {
            inner: Arc::new(Inner {
                registry,
                delete_total,
                delete_failed_total,
                delete_duration,
                wipes_running,
                wipe_bytes,
                discovery_total,
                pass_duration,
                discovery_duration,
                capacity_bytes,
                pass_capacity: [AtomicU64::new(0), AtomicU64::new(0)],
                volumes,
                flagged,
                device_claims,
                device_claims_total,
                devices_refused,
                claims_withdrawn,
                full_read_done,
                full_read_total,
                full_reads,
                config_valid,
                api_requests,
                api_requests_failed,
                api_duration,
                succession,
                unpublished,
                unresponsive,
                operations_stuck,
                failing,
                fenced,
                cleanup_actions,
                cleanup_failures,
                gone_nodes,
                leader,
                nodes_unreadable,
                cleanup_pv_deleted,
                cleanup_pv_delete_failed,
                cleanup_claim_deleted,
                cleanup_claim_delete_failed,
            }),
        }
    }

    /// Counts a wipe as running until the returned guard is dropped (whatever way it ends).
    pub fn wipe_running(&self) -> WipeRunning {
        self.inner.wipes_running.inc();
        WipeRunning { gauge: self.inner.wipes_running.clone() }
    }

    /// Records one finished wipe: counted as upstream counts a deletion, its duration only
    /// when it succeeded (as upstream). `capacity_bytes` is the PV's, `cleanup_command` the
    /// class's first blockCleanerCommand word ("" without one).
    pub fn wipe_finished(&self, wipe: &FinishedWipe<'_>) {
        let mode = upstream_mode(wipe.mode);
        let labels = DeleteLabels { mode: mode.clone(), r#type: "process".into() };
        if wipe.ok {
            self.inner.delete_total.get_or_create(&labels).inc();
            self.inner.wipe_bytes.get_or_create(&ModeLabels { mode: mode.clone() }).inc_by(wipe.bytes_wiped);
            let duration_labels = DeleteDurationLabels {
                mode,
                r#type: "process".into(),
                capacity: capacity_breakdown(wipe.capacity_bytes),
                cleanup_command: wipe.cleanup_command.to_string(),
            };
            self.inner.delete_duration.get_or_create(&duration_labels).observe(wipe.elapsed.as_secs_f64());
        } else {
            self.inner.delete_failed_total.get_or_create(&labels).inc();
        }
    }

    /// Records one PV created by discovery; its capacity counts in this pass's
    /// `persistentvolume_capacity_bytes`.
    pub fn pv_created(&self, mode: &str, capacity_bytes: u64) {
        let mode = upstream_mode(mode);
        let slot = usize::from(mode == "Block");
        self.inner.pass_capacity[slot].fetch_add(capacity_bytes, Ordering::Relaxed);
        self.inner.discovery_total.get_or_create(&ModeLabels { mode }).inc();
    }

    /// Records the duration of one reconcile pass and of its discovery part, and sets the
    /// capacity published in the pass (both modes, 0 when none: upstream sets both each pass).
    pub fn pass_done(&self, elapsed: Duration, discovery: Duration) {
        self.inner.pass_duration.observe(elapsed.as_secs_f64());
        let labels = ModeLabels { mode: "all".into() };
        self.inner.discovery_duration.get_or_create(&labels).observe(discovery.as_secs_f64());
        for (slot, mode) in ["Filesystem", "Block"].into_iter().enumerate() {
            let bytes = self.inner.pass_capacity[slot].swap(0, Ordering::Relaxed);
            let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
            self.inner.capacity_bytes.get_or_create(&ModeLabels { mode: mode.into() }).set(bytes);
        }
    }

    /// Sets the number of this node's PVs per phase (phases not listed drop to zero).
    pub fn set_volumes(&self, by_phase: &std::collections::BTreeMap<String, i64>) {
        for phase in ["Available", "Bound", "Released", "Failed", "Pending"] {
            let n = by_phase.get(phase).copied().unwrap_or(0);
            self.inner.volumes.get_or_create(&StateLabels { state: phase.to_string() }).set(n);
        }
    }

    /// Sets how many of this node's PVs carry each flag an operator must act on (missing,
    /// stale, moved): the state behind the VolumeMissing / VolumeStale / VolumeMoved events,
    /// so an alert can say it still holds. Every flag is set, zero when none.
    pub fn set_flagged(&self, missing: i64, stale: i64, moved: i64) {
        for (flag, n) in [("missing", missing), ("stale", stale), ("moved", moved)] {
            self.inner.flagged.get_or_create(&FlagLabels { flag: flag.to_string() }).set(n);
        }
    }

    /// Sets the device claim figures of the last pass: links kept per class, and devices
    /// refused per class and reason (every class with a devices section is set, zero when none).
    pub fn set_device_claims(
        &self,
        kept: &std::collections::BTreeMap<String, i64>,
        refused: &std::collections::BTreeMap<(String, &'static str), i64>,
    ) {
        self.inner.device_claims.clear();
        for (class, n) in kept {
            self.inner.device_claims.get_or_create(&ClassLabels { class: class.clone() }).set(*n);
        }
        self.inner.devices_refused.clear();
        for ((class, reason), n) in refused {
            let labels = ClassReasonLabels { class: class.clone(), reason: reason.to_string() };
            self.inner.devices_refused.get_or_create(&labels).set(*n);
        }
    }

    /// Counts one unbound PV of a claimed device of `class` withdrawn for foreign use.
    pub fn claim_withdrawn(&self, class: &str) {
        self.inner.claims_withdrawn.get_or_create(&ClassLabels { class: class.to_string() }).inc();
    }

    /// Sets the full read figures: the read under way (device, stable id, bytes done and in
    /// all; none cleared), and the finished reads by result since start (a running total).
    pub fn set_full_reads(
        &self,
        running: Option<(&str, &str, u64, u64)>,
        results: &std::collections::BTreeMap<&'static str, u64>,
    ) {
        self.inner.full_read_done.clear();
        self.inner.full_read_total.clear();
        if let Some((device, disk, done, total)) = running {
            let labels = DeviceLabels { device: device.to_string(), disk: disk.to_string() };
            self.inner.full_read_done.get_or_create(&labels).set(i64::try_from(done).unwrap_or(i64::MAX));
            self.inner.full_read_total.get_or_create(&labels).set(i64::try_from(total).unwrap_or(i64::MAX));
        }
        for (result, n) in results {
            let counter = self.inner.full_reads.get_or_create(&ResultLabels { result: result.to_string() });
            counter.inc_by(n.saturating_sub(counter.get()));
        }
    }

    /// Counts one device linked for `class`.
    pub fn device_claimed(&self, class: &str) {
        self.inner.device_claims_total.get_or_create(&ClassLabels { class: class.to_string() }).inc();
    }

    /// Sets how many entries the last pass did not publish, per reason; reasons absent from
    /// `by_reason` are removed, so the gauge shows the current state, not history.
    pub fn set_unpublished(&self, by_reason: &std::collections::BTreeMap<&'static str, i64>) {
        self.inner.unpublished.clear();
        for (reason, n) in by_reason {
            self.inner.unpublished.get_or_create(&ReasonLabels { reason: reason.to_string() }).set(*n);
        }
    }

    /// The unresponsive subjects (path, operation) and the operations stuck now.
    pub fn set_unresponsive(&self, stalls: &[(String, String)], stuck: usize) {
        self.inner.unresponsive.clear();
        for (path, operation) in stalls {
            let labels = StallLabels { path: path.clone(), operation: operation.clone() };
            self.inner.unresponsive.get_or_create(&labels).set(1);
        }
        self.inner.operations_stuck.set(stuck as i64);
    }

    /// The fences in force on this node: (PV name, reason).
    pub fn set_fenced(&self, fenced: &[(String, &'static str)]) {
        self.inner.fenced.clear();
        for (pv, reason) in fenced {
            self.inner.fenced.get_or_create(&FenceLabels { pv: pv.clone(), reason: reason.to_string() }).set(1);
        }
    }

    /// The failing signs of this node's volumes: (path, PV name or "", reason code).
    pub fn set_failing(&self, failing: &[(String, String, String)]) {
        self.inner.failing.clear();
        for (path, pv, reason) in failing {
            let labels = FailingLabels { path: path.clone(), pv: pv.clone(), reason: reason.clone() };
            self.inner.failing.get_or_create(&labels).set(1);
        }
    }

    /// Records one API request.
    pub fn api_request(&self, method: &str, ok: bool, elapsed: Duration) {
        let labels = MethodLabels { method: method.to_string() };
        self.inner.api_requests.get_or_create(&labels).inc();
        if !ok {
            self.inner.api_requests_failed.get_or_create(&labels).inc();
        }
        self.inner.api_duration.get_or_create(&labels).observe(elapsed.as_secs_f64());
    }

    /// Records whether the configuration on disk is the one in use.
    pub fn set_config_valid(&self, valid: bool) {
        self.inner.config_valid.set(i64::from(valid));
    }

    /// Records a succession decision of the agent (readopted, withdrawn, flagged_stale, unverified).
    pub fn succession(&self, outcome: &str) {
        self.inner.succession.get_or_create(&OutcomeLabels { outcome: outcome.to_string() }).inc();
    }

    /// Records one node-cleanup action (delete_claim, delete_pv, release_finalizer) and its
    /// cause; a claim deletion also in upstream's claim counters.
    pub fn node_cleanup_action(&self, action: &str, cause: &str, ok: bool) {
        if action == "delete_claim" {
            if ok { &self.inner.cleanup_claim_deleted } else { &self.inner.cleanup_claim_delete_failed }.inc();
        }
        let labels = ActionLabels { action: action.to_string(), cause: cause.to_string() };
        if ok {
            self.inner.cleanup_actions.get_or_create(&labels).inc();
        } else {
            self.inner.cleanup_failures.get_or_create(&labels).inc();
        }
    }

    /// Records a PV deletion by node-cleanup in upstream's counters, by the PV's phase.
    pub fn node_cleanup_pv_delete(&self, phase: &str, ok: bool) {
        let labels = PhaseLabels { phase: phase.to_string() };
        if ok { &self.inner.cleanup_pv_deleted } else { &self.inner.cleanup_pv_delete_failed }
            .get_or_create(&labels)
            .inc();
    }

    /// Sets the number of absent Nodes named by opted-in PVs.
    pub fn set_absent_nodes(&self, n: usize) {
        self.inner.gone_nodes.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Sets whether this replica leads.
    pub fn set_leader(&self, leader: bool) {
        self.inner.leader.set(i64::from(leader));
    }

    /// Counts a pass skipped because Nodes could not be listed.
    pub fn nodes_unreadable(&self) {
        self.inner.nodes_unreadable.inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.inner.registry);
        out
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

/// The standard `process_*` metrics (client_golang's names, types and help), read from /proc
/// at each scrape; a figure that cannot be read is left out of that scrape.
#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: f64) -> std::fmt::Result {
            let metric = ConstGauge::new(value);
            metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
        }
        use crate::host::process;
        match process::read_stats() {
            Ok(stats) => {
                let cpu = ConstCounter::new(stats.cpu_seconds);
                cpu.encode(encoder.encode_descriptor(
                    "process_cpu_seconds",
                    "Total user and system CPU time spent in seconds.",
                    None,
                    cpu.metric_type(),
                )?)?;
                gauge(
                    &mut encoder,
                    "process_resident_memory_bytes",
                    "Resident memory size in bytes.",
                    stats.resident_bytes as f64,
                )?;
                gauge(
                    &mut encoder,
                    "process_virtual_memory_bytes",
                    "Virtual memory size in bytes.",
                    stats.virtual_bytes as f64,
                )?;
                gauge(
                    &mut encoder,
                    "process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds.",
                    stats.start_time_seconds,
                )?;
            }
            Err(e) => tracing::debug!(error = %e, "process metrics left out of this scrape"),
        }
        match process::open_fds() {
            Ok(n) => gauge(&mut encoder, "process_open_fds", "Number of open file descriptors.", n as f64)?,
            Err(e) => tracing::debug!(error = %e, "process_open_fds left out of this scrape"),
        }
        // Unlimited is 2^64 - 1 in client_golang's output (procfs reads "unlimited" so); an
        // unlimited file limit does not happen on Linux (RLIMIT_NOFILE is capped by nr_open).
        let (max_fds, max_vm) = process::limits();
        if let Some(n) = max_fds {
            gauge(&mut encoder, "process_max_fds", "Maximum number of open file descriptors.", n as f64)?;
        }
        gauge(
            &mut encoder,
            "process_virtual_memory_max_bytes",
            "Maximum amount of virtual memory available in bytes.",
            max_vm.map_or(u64::MAX as f64, |n| n as f64),
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The type a `# TYPE` line gives `name` (OpenMetrics names a counter without `_total`).
    fn type_of<'a>(text: &'a str, name: &str) -> Option<&'a str> {
        text.lines().find_map(|l| l.strip_prefix("# TYPE ")?.strip_prefix(name)?.strip_prefix(' '))
    }

    fn assert_types(text: &str, expected: &[(&str, &str)]) {
        for (name, kind) in expected {
            assert_eq!(type_of(text, name), Some(*kind), "# TYPE of {name} in:\n{text}");
        }
    }

    fn assert_lines(text: &str, lines: &[&str]) {
        for line in lines {
            assert!(text.lines().any(|l| l == *line), "missing line {line:?} in:\n{text}");
        }
    }

    fn finished<'a>(mode: &'a str, ok: bool, capacity_bytes: u64, cleanup_command: &'a str) -> FinishedWipe<'a> {
        FinishedWipe {
            mode,
            ok,
            elapsed: Duration::from_millis(300),
            bytes_wiped: 4096,
            capacity_bytes,
            cleanup_command,
        }
    }

    #[test]
    fn upstream_agent_metrics_keep_their_names_types_and_labels() {
        let m = Metrics::new();
        let gib = 1024 * 1024 * 1024;
        m.wipe_finished(&finished("fs", true, 10 * gib, "/scripts/quick_reset.sh"));
        m.wipe_finished(&finished("block", true, 600 * gib, ""));
        m.wipe_finished(&finished("block", false, 600 * gib, ""));
        m.pv_created("fs", 10 * gib);
        m.pv_created("fs", 5 * gib);
        m.set_volumes(&std::collections::BTreeMap::from([("Bound".to_string(), 3)]));
        m.set_flagged(1, 0, 2);
        m.pass_done(Duration::from_millis(20), Duration::from_millis(5));
        m.api_request("create", true, Duration::from_millis(3));
        m.api_request("create", false, Duration::from_millis(3));
        let text = m.encode();
        // pkg/metrics/metrics.go of the Go provisioner.
        assert_types(
            &text,
            &[
                ("local_volume_provisioner_persistentvolume_capacity_bytes", "gauge"),
                ("local_volume_provisioner_persistentvolume_discovery", "counter"),
                ("local_volume_provisioner_persistentvolume_discovery_duration_seconds", "histogram"),
                ("local_volume_provisioner_persistentvolume_delete", "counter"),
                ("local_volume_provisioner_persistentvolume_delete_failed", "counter"),
                ("local_volume_provisioner_persistentvolume_delete_duration_seconds", "histogram"),
                ("local_volume_provisioner_apiserver_requests", "counter"),
                ("local_volume_provisioner_apiserver_requests_failed", "counter"),
                ("local_volume_provisioner_apiserver_requests_duration_seconds", "histogram"),
                ("local_volume_provisioner_proctable_running", "gauge"),
            ],
        );
        assert_lines(
            &text,
            &[
                // Kubernetes volume modes, as upstream's label values.
                "local_volume_provisioner_persistentvolume_capacity_bytes{mode=\"Filesystem\"} 16106127360",
                "local_volume_provisioner_persistentvolume_capacity_bytes{mode=\"Block\"} 0",
                "local_volume_provisioner_persistentvolume_discovery_total{mode=\"Filesystem\"} 2",
                "local_volume_provisioner_persistentvolume_delete_total{mode=\"Filesystem\",type=\"process\"} 1",
                "local_volume_provisioner_persistentvolume_delete_total{mode=\"Block\",type=\"process\"} 1",
                "local_volume_provisioner_persistentvolume_delete_failed_total{mode=\"Block\",type=\"process\"} 1",
                "local_volume_provisioner_persistentvolume_delete_duration_seconds_count{mode=\"Filesystem\",type=\"process\",capacity=\"500G\",cleanup_command=\"/scripts/quick_reset.sh\"} 1",
                "local_volume_provisioner_persistentvolume_delete_duration_seconds_count{mode=\"Block\",type=\"process\",capacity=\"1000G\",cleanup_command=\"\"} 1",
                // client_golang's DefBuckets.
                "local_volume_provisioner_persistentvolume_delete_duration_seconds_bucket{le=\"0.25\",mode=\"Filesystem\",type=\"process\",capacity=\"500G\",cleanup_command=\"/scripts/quick_reset.sh\"} 0",
                "local_volume_provisioner_persistentvolume_delete_duration_seconds_bucket{le=\"0.5\",mode=\"Filesystem\",type=\"process\",capacity=\"500G\",cleanup_command=\"/scripts/quick_reset.sh\"} 1",
                "local_volume_provisioner_persistentvolume_discovery_duration_seconds_count{mode=\"all\"} 1",
                "local_volume_provisioner_apiserver_requests_total{method=\"create\"} 2",
                "local_volume_provisioner_apiserver_requests_failed_total{method=\"create\"} 1",
                "local_volume_provisioner_proctable_running 0",
                "local_static_provisioner_wipe_bytes_total{mode=\"Filesystem\"} 4096",
                "local_static_provisioner_volumes{state=\"Bound\"} 3",
                "local_static_provisioner_volumes{state=\"Available\"} 0",
                "local_static_provisioner_flagged_volumes{flag=\"missing\"} 1",
                "local_static_provisioner_flagged_volumes{flag=\"stale\"} 0",
                "local_static_provisioner_flagged_volumes{flag=\"moved\"} 2",
            ],
        );
        // A failed wipe has no duration, as upstream.
        assert!(!text.contains(
            "delete_duration_seconds_count{mode=\"Block\",type=\"process\",capacity=\"1000G\",cleanup_command=\"\"} 2"
        ));
        assert!(!text.contains("node_cleanup"), "the agent exposes no node-cleanup metrics");

        // The capacity gauge is the last pass's: a pass that publishes nothing sets it to 0.
        m.pv_created("block", 64 * 1024 * 1024);
        m.pass_done(Duration::from_millis(20), Duration::from_millis(5));
        m.pass_done(Duration::from_millis(20), Duration::from_millis(5));
        let text = m.encode();
        assert_lines(
            &text,
            &[
                "local_volume_provisioner_persistentvolume_capacity_bytes{mode=\"Filesystem\"} 0",
                "local_volume_provisioner_persistentvolume_capacity_bytes{mode=\"Block\"} 0",
            ],
        );
    }

    #[test]
    fn capacity_label_is_upstreams_500g_breakdown() {
        let gib = 1024 * 1024 * 1024;
        assert_eq!(capacity_breakdown(0), "0G");
        assert_eq!(capacity_breakdown(1), "500G");
        assert_eq!(capacity_breakdown(500 * gib), "500G");
        assert_eq!(capacity_breakdown(500 * gib + 1), "1000G");
        assert_eq!(capacity_breakdown(1400 * gib), "1500G");
    }

    #[test]
    fn running_wipes_are_counted_until_they_end() {
        let m = Metrics::new();
        let first = m.wipe_running();
        let second = m.wipe_running();
        assert_lines(&m.encode(), &["local_volume_provisioner_proctable_running 2"]);
        drop(first);
        assert_lines(&m.encode(), &["local_volume_provisioner_proctable_running 1"]);
        drop(second);
        assert_lines(&m.encode(), &["local_volume_provisioner_proctable_running 0"]);
    }

    #[test]
    fn both_roles_expose_process_and_build_info() {
        for role in [Role::Agent, Role::NodeCleanup] {
            let text = Metrics::for_role(role).encode();
            assert_types(
                &text,
                &[
                    ("process_cpu_seconds", "counter"),
                    ("process_resident_memory_bytes", "gauge"),
                    ("process_virtual_memory_bytes", "gauge"),
                    ("process_virtual_memory_max_bytes", "gauge"),
                    ("process_open_fds", "gauge"),
                    ("process_max_fds", "gauge"),
                    ("process_start_time_seconds", "gauge"),
                    ("local_static_provisioner_build_info", "gauge"),
                ],
            );
            let value = |name: &str| -> f64 {
                let line =
                    text.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name}"));
                line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{line}"))
            };
            assert!(value("process_resident_memory_bytes") > 0.0);
            assert!(value("process_open_fds") >= 3.0);
            assert!(value("process_start_time_seconds") > 1.6e9);
            // Ticks of 10 ms: a test process may not have used one yet.
            assert!(value("process_cpu_seconds_total") >= 0.0);
            let build = format!(
                "local_static_provisioner_build_info{{version=\"{}\",commit=\"{}\",build_date=\"{}\",rustc=\"{}\",target=\"{}\"}} 1",
                crate::build_info::VERSION,
                crate::build_info::GIT_COMMIT,
                crate::build_info::BUILD_DATE,
                crate::build_info::RUSTC_VERSION,
                crate::build_info::TARGET
            );
            assert_lines(&text, &[&build]);
        }
    }

    #[test]
    fn node_cleanup_exposes_upstreams_and_its_own() {
        let m = Metrics::for_role(Role::NodeCleanup);
        m.node_cleanup_action("delete_claim", "node_gone", true);
        m.node_cleanup_action("delete_claim", "node_gone", false);
        m.node_cleanup_action("delete_pv", "stale", false);
        m.node_cleanup_pv_delete("Released", true);
        m.node_cleanup_pv_delete("Available", false);
        m.set_leader(true);
        m.set_absent_nodes(2);
        m.nodes_unreadable();
        m.api_request("delete", true, Duration::from_millis(3));
        let text = m.encode();
        // pkg/metrics/node-cleanup/metrics.go of the Go provisioner.
        assert_types(
            &text,
            &[
                ("local_volume_node_cleanup_persistentvolume_delete", "counter"),
                ("local_volume_node_cleanup_persistentvolume_delete_failed", "counter"),
                ("local_volume_node_cleanup_persistentvolumeclaim_delete", "counter"),
                ("local_volume_node_cleanup_persistentvolumeclaim_delete_failed", "counter"),
            ],
        );
        assert_lines(
            &text,
            &[
                "local_volume_node_cleanup_persistentvolume_delete_total{phase=\"Released\"} 1",
                "local_volume_node_cleanup_persistentvolume_delete_failed_total{phase=\"Available\"} 1",
                "local_volume_node_cleanup_persistentvolumeclaim_delete_total 1",
                "local_volume_node_cleanup_persistentvolumeclaim_delete_failed_total 1",
                "local_static_provisioner_node_cleanup_actions_total{action=\"delete_claim\",cause=\"node_gone\"} 1",
                "local_static_provisioner_node_cleanup_failures_total{action=\"delete_pv\",cause=\"stale\"} 1",
                "local_static_provisioner_node_cleanup_leader 1",
                "local_static_provisioner_node_cleanup_absent_nodes 2",
                "local_static_provisioner_node_cleanup_nodes_unreadable_total 1",
                "local_volume_provisioner_apiserver_requests_total{method=\"delete\"} 1",
            ],
        );
        assert!(!text.contains("persistentvolume_capacity"), "no agent metrics in node-cleanup:\n{text}");
        assert!(!text.contains("local_volume_provisioner_persistentvolume_delete"), "{text}");
    }
}

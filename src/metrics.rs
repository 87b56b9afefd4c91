//! Prometheus metrics. Upstream's metric names are kept so existing dashboards and alerts keep
//! working after the image swap; ours are added under `local_static_provisioner_`.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

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
    delete_duration: Family<DeleteLabels, Histogram>,
    wipe_bytes: Family<ModeLabels, Counter>,
    discovery_total: Family<ModeLabels, Counter>,
    pass_duration: Histogram,
    discovery_duration: Family<ModeLabels, Histogram>,
    capacity_bytes: Family<ModeLabels, Histogram>,
    volumes: Family<StateLabels, Gauge>,
    config_valid: Gauge,
    api_requests: Family<MethodLabels, Counter>,
    api_requests_failed: Family<MethodLabels, Counter>,
    api_duration: Family<MethodLabels, Histogram>,
    succession: Family<OutcomeLabels, Counter>,
    unpublished: Family<ReasonLabels, Gauge>,
    cleanup_actions: Family<ActionLabels, Counter>,
    cleanup_failures: Family<ActionLabels, Counter>,
    gone_nodes: Gauge,
    leader: Gauge,
    nodes_unreadable: Counter,
}

/// Outcome of a succession decision about a PV of an earlier incarnation of the node.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

/// Why entries of the discovery directories are not published.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
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
        let delete_duration = Family::<DeleteLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.1, 4.0, 10))
        });
        let wipe_bytes = Family::<ModeLabels, Counter>::default();
        let discovery_total = Family::<ModeLabels, Counter>::default();
        let pass_duration = Histogram::new(exponential_buckets(0.001, 4.0, 10));
        let config_valid = Gauge::default();
        let discovery_duration = Family::<ModeLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 4.0, 10))
        });
        let capacity_bytes = Family::<ModeLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(1024.0 * 1024.0, 4.0, 12))
        });
        let volumes = Family::<StateLabels, Gauge>::default();
        let api_requests = Family::<MethodLabels, Counter>::default();
        let api_requests_failed = Family::<MethodLabels, Counter>::default();
        let api_duration = Family::<MethodLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 4.0, 10))
        });
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
            "Capacity of the PVs created (upstream name)",
            capacity_bytes.clone(),
        );
        agent_registry.register("local_static_provisioner_volumes", "This node's PVs by phase", volumes.clone());
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
            "Duration of wipes (upstream name)",
            delete_duration.clone(),
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
        let cleanup_actions = Family::<ActionLabels, Counter>::default();
        let cleanup_failures = Family::<ActionLabels, Counter>::default();
        let gone_nodes = Gauge::default();
        let leader = Gauge::default();
        let nodes_unreadable = Counter::default();
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
                wipe_bytes,
                discovery_total,
                pass_duration,
                discovery_duration,
                capacity_bytes,
                volumes,
                config_valid,
                api_requests,
                api_requests_failed,
                api_duration,
                succession,
                unpublished,
                cleanup_actions,
                cleanup_failures,
                gone_nodes,
                leader,
                nodes_unreadable,
            }),
        }
    }

    /// Records one finished wipe.
    pub fn wipe_finished(&self, mode: &str, ok: bool, elapsed: Duration, bytes: u64) {
        let labels = DeleteLabels { mode: mode.to_string(), r#type: "process".into() };
        if ok {
            self.inner.delete_total.get_or_create(&labels).inc();
            self.inner.wipe_bytes.get_or_create(&ModeLabels { mode: mode.to_string() }).inc_by(bytes);
        } else {
            self.inner.delete_failed_total.get_or_create(&labels).inc();
        }
        self.inner.delete_duration.get_or_create(&labels).observe(elapsed.as_secs_f64());
    }

    /// Records one PV created by discovery.
    pub fn pv_created(&self, mode: &str, capacity_bytes: u64) {
        let labels = ModeLabels { mode: mode.to_string() };
        self.inner.discovery_total.get_or_create(&labels).inc();
        self.inner.capacity_bytes.get_or_create(&labels).observe(capacity_bytes as f64);
    }

    /// Records the duration of one reconcile pass and of its discovery part.
    pub fn pass_done(&self, elapsed: Duration, discovery: Duration) {
        self.inner.pass_duration.observe(elapsed.as_secs_f64());
        let labels = ModeLabels { mode: "all".into() };
        self.inner.discovery_duration.get_or_create(&labels).observe(discovery.as_secs_f64());
    }

    /// Sets the number of this node's PVs per phase (phases not listed drop to zero).
    pub fn set_volumes(&self, by_phase: &std::collections::BTreeMap<String, i64>) {
        for phase in ["Available", "Bound", "Released", "Failed", "Pending"] {
            let n = by_phase.get(phase).copied().unwrap_or(0);
            self.inner.volumes.get_or_create(&StateLabels { state: phase.to_string() }).set(n);
        }
    }

    /// Sets how many entries the last pass did not publish, per reason; reasons absent from
    /// `by_reason` are removed, so the gauge shows the current state, not history.
    pub fn set_unpublished(&self, by_reason: &std::collections::BTreeMap<&'static str, i64>) {
        self.inner.unpublished.clear();
        for (reason, n) in by_reason {
            self.inner.unpublished.get_or_create(&ReasonLabels { reason: reason.to_string() }).set(*n);
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

    /// Records one node-cleanup action (delete_claim, delete_pv, release_finalizer) and its cause.
    pub fn node_cleanup_action(&self, action: &str, cause: &str, ok: bool) {
        let labels = ActionLabels { action: action.to_string(), cause: cause.to_string() };
        if ok {
            self.inner.cleanup_actions.get_or_create(&labels).inc();
        } else {
            self.inner.cleanup_failures.get_or_create(&labels).inc();
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_names_are_exposed() {
        let m = Metrics::new();
        m.wipe_finished("fs", true, Duration::from_millis(300), 4096);
        m.wipe_finished("block", false, Duration::from_secs(2), 0);
        m.pv_created("fs", 10 * 1024 * 1024 * 1024);
        m.set_volumes(&std::collections::BTreeMap::from([("Bound".to_string(), 3)]));
        m.pass_done(Duration::from_millis(20), Duration::from_millis(5));
        m.api_request("create", true, Duration::from_millis(3));
        m.api_request("create", false, Duration::from_millis(3));
        let text = m.encode();
        for line in [
            "local_volume_provisioner_persistentvolume_delete_total{mode=\"fs\",type=\"process\"} 1",
            "local_volume_provisioner_persistentvolume_delete_failed_total{mode=\"block\",type=\"process\"} 1",
            "local_static_provisioner_wipe_bytes_total{mode=\"fs\"} 4096",
            "local_volume_provisioner_persistentvolume_discovery_total{mode=\"fs\"} 1",
            "local_static_provisioner_volumes{state=\"Bound\"} 3",
            "local_volume_provisioner_apiserver_requests_total{method=\"create\"} 2",
            "local_volume_provisioner_apiserver_requests_failed_total{method=\"create\"} 1",
            "local_static_provisioner_volumes{state=\"Available\"} 0",
            "local_volume_provisioner_persistentvolume_capacity_bytes_count{mode=\"fs\"} 1",
            "local_volume_provisioner_persistentvolume_discovery_duration_seconds_count{mode=\"all\"} 1",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
        assert!(text.contains("local_volume_provisioner_persistentvolume_delete_duration_seconds_bucket"));
        assert!(!text.contains("node_cleanup"), "the agent exposes no node-cleanup metrics");
    }

    #[test]
    fn node_cleanup_exposes_only_its_own() {
        let m = Metrics::for_role(Role::NodeCleanup);
        m.node_cleanup_action("delete_claim", "node_gone", true);
        m.node_cleanup_action("delete_pv", "stale", false);
        m.set_leader(true);
        m.set_absent_nodes(2);
        m.nodes_unreadable();
        m.api_request("delete", true, Duration::from_millis(3));
        let text = m.encode();
        for line in [
            "local_static_provisioner_node_cleanup_actions_total{action=\"delete_claim\",cause=\"node_gone\"} 1",
            "local_static_provisioner_node_cleanup_failures_total{action=\"delete_pv\",cause=\"stale\"} 1",
            "local_static_provisioner_node_cleanup_leader 1",
            "local_static_provisioner_node_cleanup_absent_nodes 2",
            "local_static_provisioner_node_cleanup_nodes_unreadable_total 1",
            "local_volume_provisioner_apiserver_requests_total{method=\"delete\"} 1",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
        assert!(!text.contains("persistentvolume_delete"), "no agent metrics in node-cleanup:\n{text}");
    }
}

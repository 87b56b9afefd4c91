//! node-cleanup's metrics (upstream node-cleanup's counters and ours) and the calls that
//! record them.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Metrics;

/// node-cleanup's metrics: upstream's delete counters, then ours.
pub(super) struct Cleanup {
    cleanup_pv_deleted: Family<PhaseLabels, Counter>,
    cleanup_pv_delete_failed: Family<PhaseLabels, Counter>,
    cleanup_claim_deleted: Counter,
    cleanup_claim_delete_failed: Counter,
    cleanup_actions: Family<ActionLabels, Counter>,
    cleanup_failures: Family<ActionLabels, Counter>,
    gone_nodes: Gauge,
    leader: Gauge,
    nodes_unreadable: Counter,
}

impl Cleanup {
    /// The families, registered in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let group = Cleanup {
            cleanup_pv_deleted: Family::default(),
            cleanup_pv_delete_failed: Family::default(),
            cleanup_claim_deleted: Counter::default(),
            cleanup_claim_delete_failed: Counter::default(),
            cleanup_actions: Family::default(),
            cleanup_failures: Family::default(),
            gone_nodes: Gauge::default(),
            leader: Gauge::default(),
            nodes_unreadable: Counter::default(),
        };
        registry.register(
            "local_volume_node_cleanup_persistentvolume_delete",
            "PVs deleted by node-cleanup, by phase (upstream name)",
            group.cleanup_pv_deleted.clone(),
        );
        registry.register(
            "local_volume_node_cleanup_persistentvolume_delete_failed",
            "PV deletions by node-cleanup that failed, by phase (upstream name)",
            group.cleanup_pv_delete_failed.clone(),
        );
        registry.register(
            "local_volume_node_cleanup_persistentvolumeclaim_delete",
            "Claims deleted by node-cleanup (upstream name)",
            group.cleanup_claim_deleted.clone(),
        );
        registry.register(
            "local_volume_node_cleanup_persistentvolumeclaim_delete_failed",
            "Claim deletions by node-cleanup that failed (upstream name)",
            group.cleanup_claim_delete_failed.clone(),
        );
        registry.register(
            "local_static_provisioner_node_cleanup_actions",
            "Claims deleted, PVs deleted and finalizers released by node-cleanup, by cause (node_gone, stale)",
            group.cleanup_actions.clone(),
        );
        registry.register(
            "local_static_provisioner_node_cleanup_failures",
            "node-cleanup actions that failed (retried on the next pass)",
            group.cleanup_failures.clone(),
        );
        registry.register(
            "local_static_provisioner_node_cleanup_absent_nodes",
            "Nodes named by opted-in local PVs that do not exist (within or past the grace period)",
            group.gone_nodes.clone(),
        );
        registry.register(
            "local_static_provisioner_node_cleanup_leader",
            "1 while this replica holds the leader Lease",
            group.leader.clone(),
        );
        registry.register(
            "local_static_provisioner_node_cleanup_nodes_unreadable",
            "Passes skipped because Nodes could not be listed (nothing is done without them)",
            group.nodes_unreadable.clone(),
        );
        group
    }
}

impl Metrics {
    /// Records one node-cleanup action (delete_claim, delete_pv, release_finalizer) and its
    /// cause; a claim deletion also in upstream's claim counters.
    pub fn node_cleanup_action(&self, action: &str, cause: &str, ok: bool) {
        if action == "delete_claim" {
            if ok {
                &self.inner.cleanup.cleanup_claim_deleted
            } else {
                &self.inner.cleanup.cleanup_claim_delete_failed
            }
            .inc();
        }
        let labels = ActionLabels { action: action.to_string(), cause: cause.to_string() };
        if ok {
            self.inner.cleanup.cleanup_actions.get_or_create(&labels).inc();
        } else {
            self.inner.cleanup.cleanup_failures.get_or_create(&labels).inc();
        }
    }

    /// Records a PV deletion by node-cleanup in upstream's counters, by the PV's phase.
    pub fn node_cleanup_pv_delete(&self, phase: &str, ok: bool) {
        let labels = PhaseLabels { phase: phase.to_string() };
        if ok { &self.inner.cleanup.cleanup_pv_deleted } else { &self.inner.cleanup.cleanup_pv_delete_failed }
            .get_or_create(&labels)
            .inc();
    }

    /// Sets the number of absent Nodes named by opted-in PVs.
    pub fn set_absent_nodes(&self, n: usize) {
        self.inner.cleanup.gone_nodes.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Sets whether this replica leads.
    pub fn set_leader(&self, leader: bool) {
        self.inner.cleanup.leader.set(i64::from(leader));
    }

    /// Counts a pass skipped because Nodes could not be listed.
    pub fn nodes_unreadable(&self) {
        self.inner.cleanup.nodes_unreadable.inc();
    }
}

/// What node-cleanup did and why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    action: String,
    cause: String,
}

/// Labels of upstream node-cleanup's PV delete counters: the PV's phase.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: String,
}

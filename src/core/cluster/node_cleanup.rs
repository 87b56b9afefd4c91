//! The node-cleanup planner: which claims and PVs to release because the Node their volume
//! lives on is gone for good (deleted, not just NotReady), or because the agent of a re-created
//! Node found their disk is not there any more (stale). Only classes the operator opted in are
//! considered, and only after a grace period, so a Node that is deleted and re-registers soon
//! after loses nothing. Pure: Node and PV facts and the time are passed in.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::core::volumes::naming::{
    ANN_PROVISIONED_BY, ANN_VOLUME_MOVED_TO, ANN_VOLUME_STALE, FINALIZER_WIPE, LABEL_HOSTNAME, LABEL_NODE,
    PROVISIONER_PREFIX, node_label_value,
};
use crate::core::volumes::pv_facts::PvFacts;

/// What the planner needs to know about a Node: whether a PV's affinity points at it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeView {
    /// Node name.
    pub name: String,
    /// Its `kubernetes.io/hostname` label (the value local PVs' affinity names).
    pub hostname: Option<String>,
}

/// The claim a PV is bound to, for a delete with a UID precondition and an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClaimRef {
    /// Namespace of the claim.
    pub namespace: String,
    /// Name of the claim.
    pub name: String,
    /// UID of the claim the PV was bound to: a re-created claim of the same name is not touched.
    pub uid: String,
}

/// A local PV made by a local-static-provisioner (ours or upstream's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LocalPv {
    /// PV name.
    pub name: String,
    /// PV UID (delete precondition).
    pub uid: String,
    /// resourceVersion (delete precondition: an Available PV may get bound meanwhile).
    pub resource_version: String,
    /// `spec.storageClassName`.
    pub class: String,
    /// `status.phase`.
    pub phase: String,
    /// `spec.persistentVolumeReclaimPolicy`.
    pub reclaim_policy: String,
    /// The bound claim, if any.
    pub claim: Option<ClaimRef>,
    /// The hostname value of the PV's node affinity: which Node the volume lives on.
    pub node: String,
    /// Our node label, when the PV carries it.
    pub node_label: Option<String>,
    /// A deletion timestamp is set.
    pub deleting: bool,
    /// Our wipe finalizer is present.
    pub has_wipe_finalizer: bool,
    /// When the agent marked the PV stale, if it did (None inside: unreadable mark).
    pub stale_since: Option<Option<Timestamp>>,
    /// Where on its node the agent found its disk, when not at its path (volume-moved-to).
    pub moved_to: Option<String>,
    /// `pv.kubernetes.io/provisioned-by`: our finalizer is dropped only while it is unchanged,
    /// i.e. while no agent has taken the PV over to wipe it.
    pub provisioned_by: String,
}

impl LocalPv {
    /// The PV as the planner sees it, or None when it is not a local PV made by a
    /// local-static-provisioner with a hostname affinity (never acted upon).
    pub(crate) fn from_pv(pv: &PvFacts) -> Option<Self> {
        let meta = &pv.metadata;
        let ann = |k: &str| pv.annotation(k);
        let provisioned_by = ann(ANN_PROVISIONED_BY).filter(|p| p.starts_with(PROVISIONER_PREFIX))?.clone();
        pv.local_path()?;
        let spec = &pv.spec;
        // Node selector terms are ORed: the volume is this one node's only when every term pins
        // the same single hostname. A class `selector` term (shared filesystems) makes the PV
        // usable elsewhere, so a gone Node does not mean a gone volume: such PVs are skipped.
        let mut hosts = spec.node_affinity.as_ref()?.required.as_ref()?.node_selector_terms.iter().map(|t| {
            t.match_expressions
                .iter()
                .flatten()
                .find(|r| r.key == LABEL_HOSTNAME && r.operator == "In")
                .and_then(|r| r.values.as_ref())
                .filter(|v| v.len() == 1)
                .map(|v| v[0].clone())
        });
        let node = hosts.next()??;
        if !hosts.all(|h| h.as_deref() == Some(node.as_str())) {
            return None;
        }
        let claim = spec.claim_ref.as_ref().map(|c| ClaimRef {
            namespace: c.namespace.clone().unwrap_or_default(),
            name: c.name.clone().unwrap_or_default(),
            uid: c.uid.clone().unwrap_or_default(),
        });
        Some(LocalPv {
            name: meta.name.clone()?,
            uid: meta.uid.clone()?,
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            class: spec.storage_class_name.clone().unwrap_or_default(),
            phase: pv.phase().to_string(),
            reclaim_policy: spec.persistent_volume_reclaim_policy.clone().unwrap_or_default(),
            claim,
            node,
            node_label: pv.label(LABEL_NODE).cloned(),
            deleting: meta.deletion_timestamp.is_some(),
            has_wipe_finalizer: meta.finalizers.as_ref().is_some_and(|f| f.iter().any(|f| f == FINALIZER_WIPE)),
            stale_since: ann(ANN_VOLUME_STALE).map(|v| v.parse::<Timestamp>().ok()),
            moved_to: ann(ANN_VOLUME_MOVED_TO).cloned(),
            provisioned_by,
        })
    }
}

/// Why a PV is released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cause {
    /// Its Node has not existed for longer than the grace period.
    NodeGone { node: String },
    /// The agent of its (re-created) Node found its disk missing or different.
    Stale { node: String },
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cause::NodeGone { node } => write!(f, "node {node} has been gone for longer than the grace period"),
            Cause::Stale { node } => {
                write!(f, "the agent on node {node} found its disk gone for longer than the grace period")
            }
        }
    }
}

/// One step for the node-cleanup executor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NodeCleanupAction {
    /// Delete the claim bound to `pv` (UID precondition) so its owner (a StatefulSet) can make
    /// a new one that binds on a live node.
    DeleteClaim { pv: String, claim: ClaimRef, cause: Cause },
    /// Delete the Available or Released PV (UID and resourceVersion preconditions), dropping
    /// our wipe finalizer while provisioned-by is unchanged: no agent can wipe a disk that is
    /// not there.
    DeletePv { name: String, uid: String, resource_version: String, provisioned_by: String, cause: Cause },
    /// The PV is already being deleted and waits for a wipe that cannot happen: drop our
    /// finalizer (while provisioned-by is unchanged).
    ReleaseFinalizer { name: String, uid: String, provisioned_by: String, cause: Cause },
    /// Left alone on purpose (reported once): a Released PV with reclaim policy Retain.
    Keep { name: String, why: String },
}

impl NodeCleanupAction {
    /// Why a release is planned; None for `Keep`, which releases nothing.
    pub(crate) fn cause(&self) -> Option<&Cause> {
        match self {
            NodeCleanupAction::DeleteClaim { cause, .. }
            | NodeCleanupAction::DeletePv { cause, .. }
            | NodeCleanupAction::ReleaseFinalizer { cause, .. } => Some(cause),
            NodeCleanupAction::Keep { .. } => None,
        }
    }
}

/// The Node keys (affinity hostname values) of opted-in PVs whose Node does not exist now.
/// The caller tracks since when each has been absent (a restart starts the clock again,
/// which only delays).
pub(crate) fn absent_nodes(classes: &BTreeSet<String>, nodes: &[NodeView], pvs: &[LocalPv]) -> BTreeSet<String> {
    pvs.iter().filter(|pv| classes.contains(&pv.class) && !node_exists(pv, nodes)).map(|pv| pv.node.clone()).collect()
}

/// Whether any Node matches the PV's affinity value or its node label, by name or hostname
/// label. Any match counts, so a doubt never turns into a deletion.
fn node_exists(pv: &LocalPv, nodes: &[NodeView]) -> bool {
    nodes.iter().any(|n| {
        n.name == pv.node
            || n.hostname.as_deref() == Some(pv.node.as_str())
            || pv.node_label.as_deref().is_some_and(|l| l == node_label_value(&n.name))
    })
}

/// UIDs of opted-in PVs that carry a stale mark: the caller tracks since when it has seen each,
/// on its own clock, because the mark's time was written by the node's clock.
pub(crate) fn stale_pvs(classes: &BTreeSet<String>, pvs: &[LocalPv]) -> BTreeSet<String> {
    pvs.iter().filter(|pv| classes.contains(&pv.class) && pv.stale_since.is_some()).map(|pv| pv.uid.clone()).collect()
}

/// Plans one pass. `gone` holds the node keys absent for longer than the grace period;
/// `stale_seen` the UIDs of PVs whose stale mark this process has seen for longer than it. A
/// stale PV is due when both the mark's own time and our sighting are older than `grace`.
/// Returns the actions sorted by PV name and the earliest time a waiting stale mark is due.
pub(crate) fn plan_node_cleanup(
    classes: &BTreeSet<String>,
    nodes: &[NodeView],
    pvs: &[LocalPv],
    gone: &BTreeSet<String>,
    stale_seen: &BTreeSet<String>,
    grace: Duration,
    now: Timestamp,
) -> (Vec<NodeCleanupAction>, Option<Timestamp>) {
    // An API server that answers with no Node at all is not a cluster whose every node died:
    // this controller itself runs on a Node. Never act on such an answer.
    if nodes.is_empty() {
        return (Vec::new(), None);
    }
    let mut next_due: Option<Timestamp> = None;
    let mut by_name: BTreeMap<&str, NodeCleanupAction> = BTreeMap::new();
    for pv in pvs.iter().filter(|pv| classes.contains(&pv.class)) {
        let cause = if !node_exists(pv, nodes) {
            if !gone.contains(&pv.node) {
                continue;
            }
            Cause::NodeGone { node: pv.node.clone() }
        } else if let Some(to) = pv.moved_to.as_ref().filter(|_| pv.stale_since.is_some()) {
            // The agent found the disk at another entry of its live node: the data is there, so
            // nothing is released, whatever else the PV says.
            by_name.insert(
                pv.name.as_str(),
                NodeCleanupAction::Keep {
                    name: pv.name.clone(),
                    why: format!("its disk is at {to} on live node {}; a claim on it is never released", pv.node),
                },
            );
            continue;
        } else if let Some(since) = pv.stale_since {
            // An unreadable mark counts from our own sighting only.
            if let Some(since) = since {
                let due = since.checked_add(grace_span(grace)).unwrap_or(Timestamp::MAX);
                if due > now {
                    next_due = Some(next_due.map_or(due, |n| n.min(due)));
                    continue;
                }
            }
            if !stale_seen.contains(&pv.uid) {
                continue; // Our own sighting is not old enough yet; the caller wakes for it.
            }
            Cause::Stale { node: pv.node.clone() }
        } else {
            continue;
        };
        if let Some(action) = release(pv, cause) {
            by_name.insert(pv.name.as_str(), action);
        }
    }
    (by_name.into_values().collect(), next_due)
}

fn grace_span(grace: Duration) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::try_from(grace).unwrap_or(k8s_openapi::jiff::SignedDuration::MAX)
}

fn release(pv: &LocalPv, cause: Cause) -> Option<NodeCleanupAction> {
    match (pv.phase.as_str(), &pv.claim) {
        ("Bound", Some(claim)) => {
            Some(NodeCleanupAction::DeleteClaim { pv: pv.name.clone(), claim: claim.clone(), cause })
        }
        ("Bound", None) => None, // The PV binder has not settled it yet.
        _ if pv.deleting => pv.has_wipe_finalizer.then(|| NodeCleanupAction::ReleaseFinalizer {
            name: pv.name.clone(),
            uid: pv.uid.clone(),
            provisioned_by: pv.provisioned_by.clone(),
            cause,
        }),
        ("Released", _) if pv.reclaim_policy == "Retain" => Some(NodeCleanupAction::Keep {
            name: pv.name.clone(),
            why: format!("{cause}, but its reclaim policy is Retain; delete it by hand when its data is not needed"),
        }),
        ("Available" | "Released", _) => Some(NodeCleanupAction::DeletePv {
            name: pv.name.clone(),
            uid: pv.uid.clone(),
            resource_version: pv.resource_version.clone(),
            provisioned_by: pv.provisioned_by.clone(),
            cause,
        }),
        // Pending or Failed: the PV binder has not settled it yet.
        _ => None,
    }
}

#[cfg(test)]
#[path = "node_cleanup_tests.rs"]
mod tests;

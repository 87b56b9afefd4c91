//! One pass of node-cleanup: reads the PV and Node stores, tracks absent Nodes and stale PVs
//! through their grace periods, plans (core::cluster::node_cleanup) and, on the leader only, carries out
//! the plan with fenced writes, confirming each gone Node with a direct query first.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::ControlFlow::{self, Break, Continue};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::Store;
use tracing::{debug, info, warn};

use super::NodeCleanupOptions;
use super::NodeWatchError;
use super::leader::Leadership;
use crate::admin::Readiness;
use crate::api::{ApiError, Cluster, NodeMeta, claim_reference, pv_reference};
use crate::core::cluster::heartbeat::{AGENT_GONE, HeartbeatVerdict, LeaseClock, heartbeat_verdict, node_of_heartbeat};
use crate::core::cluster::node_cleanup::{
    Cause, LocalPv, NodeCleanupAction, NodeView, absent_nodes, plan_node_cleanup, stale_pvs,
};
use crate::core::fence::fence_label::LABEL_VOLUMES_UNVERIFIED;
use crate::core::mounts::settle::Settler;
use crate::core::reconcile::backoff::{Policy, Retries};
use crate::core::volumes::naming::{FINALIZER_WIPE, LABEL_HOSTNAME};
use crate::core::volumes::pv_facts::PvFacts;
use crate::metrics::Metrics;

/// Logged when a pass stops because this replica no longer leads.
const LEADERSHIP_LOST: &str = "leadership lost during a pass; abandoning the rest of it";
/// Logged when a pass stops because a write outlived its deadline.
const NO_ANSWER: &str = "a write got no answer within its deadline; abandoning the rest of the pass";

/// When a failed fence of a lapsed agent's Node is tried again: after 5 s, jittered, and no
/// later however often it failed (the core's backoff with its cap at the first delay), since
/// every moment unfenced a pod may newly mount a volume of that node nobody has checked.
const FENCE_RETRY: Policy = Policy { initial: Duration::from_secs(5), max: Duration::from_secs(5) };

/// Whether a write's failure ends the pass: refused by the fence (leadership lost), or abandoned
/// at its deadline (whether it was applied is unknown: the next pass looks again).
fn ends_pass(e: &ApiError) -> bool {
    e.is_fenced() || e.is_deadline()
}

/// What a pass reads, kept fresh by the watches.
pub(super) struct Views {
    /// The agents' heartbeat Leases and since when each has been unchanged (core::cluster::heartbeat).
    pub heartbeats: Arc<Mutex<LeaseClock>>,
    /// Every PV of the cluster.
    pub pvs: Store<PvFacts>,
    /// Every Node, trimmed to name and hostname label.
    pub nodes: Store<NodeMeta>,
    /// Why the Node watch last failed, while it does.
    pub node_watch_error: NodeWatchError,
}

/// Plans and carries out passes; remembers across passes only what is still true now.
pub(super) struct Worker {
    /// Fenced on `leadership` for every write.
    cluster: Cluster,
    metrics: Metrics,
    readiness: Readiness,
    leadership: Leadership,
    /// The deadline of each write, for which leadership must still hold when it goes out.
    request_deadline: Duration,
    views: Views,
    opts: NodeCleanupOptions,
    /// Since when each Node key named by an opted-in PV has been absent.
    absent: Settler,
    /// Since when each opted-in PV's stale mark has been seen (our clock, not the node's).
    stale: Settler,
    /// Claims deleted and PVs kept, while the plan still holds them.
    once: Once,
    /// When each gone Node was last confirmed absent by a direct query, this pass.
    node_checks: BTreeMap<String, Instant>,
    /// Whether an answer with no Node at all was reported (until one lists some again).
    no_nodes_reported: bool,
    /// Whether a pass skipped for want of Nodes was reported (until one can read them again).
    nodes_unreadable_reported: bool,
    /// Absent Nodes already logged.
    absent_logged: BTreeSet<String>,
    /// Failed fences of lapsed agents' Nodes, by Node, until one succeeds or the Node's
    /// heartbeat no longer lapsed.
    fence_failures: Retries<String>,
}

impl Worker {
    /// A worker that has seen nothing yet.
    pub(super) fn new(
        cluster: Cluster,
        metrics: Metrics,
        readiness: Readiness,
        leadership: Leadership,
        request_deadline: Duration,
        views: Views,
        opts: NodeCleanupOptions,
    ) -> Self {
        Worker {
            cluster,
            metrics,
            readiness,
            leadership,
            request_deadline,
            views,
            opts,
            absent: Settler::default(),
            stale: Settler::default(),
            once: Once::default(),
            node_checks: BTreeMap::new(),
            no_nodes_reported: false,
            nodes_unreadable_reported: false,
            absent_logged: BTreeSet::new(),
            fence_failures: Retries::default(),
        }
    }

    /// The Nodes as the watch last saw them; None until it has listed them once.
    fn nodes(&self) -> Option<Vec<NodeView>> {
        let synced = matches!(self.views.nodes.wait_until_ready().now_or_never(), Some(Ok(())));
        synced.then(|| self.views.nodes.state().iter().map(|n| node_view(&n.metadata)).collect())
    }

    /// Why the Node watch fails, if it does.
    fn node_watch_error(&self) -> Option<String> {
        self.views.node_watch_error.lock().ok().and_then(|e| e.clone())
    }

    /// One pass: plan from the stores, and act when this replica leads.
    pub(super) async fn pass(&mut self, next_due: &mut Option<Instant>) {
        let watch_error = self.node_watch_error();
        self.readiness.set_detail(watch_error.as_ref().map(|e| format!("cannot watch Nodes: {e}")));
        let Some(nodes) = self.nodes() else {
            // Without the Nodes nothing can be known to be gone: act on nothing. Right after
            // start this is the watch's first list still under way, which is no problem.
            const UNREADABLE: &str = "cannot list Nodes; nothing is done until they can be read";
            match watch_error {
                Some(e) => {
                    self.metrics.nodes_unreadable();
                    if std::mem::replace(&mut self.nodes_unreadable_reported, true) {
                        debug!(error = %e, "{UNREADABLE}");
                    } else {
                        warn!(error = %e, "{UNREADABLE}");
                    }
                }
                None => debug!("{UNREADABLE} (their watch has not listed them yet)"),
            }
            *next_due = Some(Instant::now() + self.opts.resync);
            return;
        };
        if std::mem::take(&mut self.nodes_unreadable_reported) {
            info!("Nodes listed; passes act again");
        }
        if nodes.is_empty() {
            // This process runs on a Node, so an empty list is a wrong answer, not a dead cluster.
            if !std::mem::replace(&mut self.no_nodes_reported, true) {
                warn!("the API listed no Nodes at all; acting on nothing until it lists some");
            }
            return;
        }
        self.no_nodes_reported = false;
        let pvs: Vec<LocalPv> = self.views.pvs.state().iter().filter_map(|pv| LocalPv::from_pv(pv)).collect();
        let absent = absent_nodes(&self.opts.classes, &nodes, &pvs);
        self.metrics.set_absent_nodes(absent.len());
        for node in absent.difference(&self.absent_logged) {
            warn!(node = %node, grace_s = self.opts.grace.as_secs(), "node not found; its opted-in local PVs are released after the grace period unless it returns");
        }
        for node in self.absent_logged.difference(&absent) {
            info!(node = %node, "node is back (or has no opted-in PVs left)");
        }
        self.absent_logged = absent.clone();
        let (gone, next_gone) = self.absent.observe(absent, Instant::now(), self.opts.grace);
        let stale = stale_pvs(&self.opts.classes, &pvs);
        let (stale_seen, next_seen) = self.stale.observe(stale, Instant::now(), self.opts.grace);
        let (actions, next_stale) =
            plan_node_cleanup(&self.opts.classes, &nodes, &pvs, &gone, &stale_seen, self.opts.grace, Timestamp::now());
        let next_stale = next_stale.map(|at| {
            let wait = Timestamp::now().duration_until(at);
            Instant::now() + Duration::try_from(wait).unwrap_or(Duration::ZERO)
        });
        *next_due = [next_gone, next_seen, next_stale].into_iter().flatten().min();
        self.node_checks.clear();
        let by_name: BTreeMap<&str, &LocalPv> = pvs.iter().map(|pv| (pv.name.as_str(), pv)).collect();
        self.once.retain_planned(&actions, &by_name);
        if actions.is_empty() {
            return;
        }
        if !self.leadership.is_leader() {
            debug!(due = actions.len(), "actions due, but another replica leads");
            return;
        }
        for action in actions {
            // Cheap early exits; what keeps a replica that lost the Lease from writing is the
            // fence on every write, checked after the rate limiter and the Node re-check.
            if !self.leadership.is_leader_for(self.request_deadline) {
                warn!("{LEADERSHIP_LOST}");
                return;
            }
            if !self.still_gone(&action).await {
                continue;
            }
            if let Break(e) = self.execute(action, &by_name).await {
                if e.is_fenced() {
                    warn!("{LEADERSHIP_LOST}");
                } else {
                    warn!(error = %e, "{NO_ANSWER}");
                }
                return;
            }
        }
    }

    /// Fences every Node whose agent's heartbeat Lease lapsed (core::cluster::heartbeat), on the leader
    /// only; `due` becomes the earliest time another live Lease would lapse (or a failed fence
    /// is tried again). Apart from the PV pass: the wake at a Lease's deadline costs no pass.
    pub(super) async fn fence_lapsed_agents(&mut self, due: &mut Option<Instant>) {
        *due = None;
        if self.nodes().is_none() {
            return; // Not synced: the PV pass says why; its next wake comes here again.
        }
        let labels: BTreeMap<String, Option<String>> = self
            .views
            .nodes
            .state()
            .iter()
            .filter_map(|n| {
                let name = n.metadata.name.clone()?;
                Some((name, n.metadata.labels.as_ref().and_then(|l| l.get(LABEL_VOLUMES_UNVERIFIED).cloned())))
            })
            .collect();
        let now = Instant::now();
        let leases = match self.views.heartbeats.lock() {
            Ok(clock) => clock.unchanged(now),
            Err(_) => return,
        };
        let mut lapsed = Vec::new();
        for (lease, (record, unchanged_for)) in &leases {
            let Some(node) = node_of_heartbeat(lease) else { continue };
            let label = labels.get(node).map(|l| l.as_deref());
            match heartbeat_verdict(label, Some((record, *unchanged_for))) {
                HeartbeatVerdict::Fence => lapsed.push((node.to_string(), *unchanged_for)),
                HeartbeatVerdict::WaitFor(left) => *due = Some(due.map_or(now + left, |d| d.min(now + left))),
                HeartbeatVerdict::Nothing => {}
            }
        }
        self.fence_failures.retain(|node| lapsed.iter().any(|(n, _)| n == node));
        if lapsed.is_empty() {
            return;
        }
        if !self.leadership.is_leader() {
            debug!(due = lapsed.len(), "agents' heartbeats lapsed, but another replica leads");
            return;
        }
        for (node, unchanged_for) in lapsed {
            let patch = BTreeMap::from([(LABEL_VOLUMES_UNVERIFIED.to_string(), Some(AGENT_GONE.to_string()))]);
            match self.cluster.patch_node_labels(&node, &patch).await {
                Ok(_) => {
                    self.fence_failures.succeeded(&node);
                    self.metrics.node_cleanup_action("fence_node", "agent_heartbeat_lapsed", true);
                    warn!(
                        node = %node,
                        unrenewed_s = unchanged_for.as_secs(),
                        "the agent's heartbeat lapsed (killed, crashed or cut off from the API): node fenced with {LABEL_VOLUMES_UNVERIFIED}={AGENT_GONE}; no pod newly mounts its local volumes until an agent has checked its disks"
                    );
                }
                Err(e) => {
                    if !e.is_fenced() {
                        self.metrics.node_cleanup_action("fence_node", "agent_heartbeat_lapsed", false);
                    }
                    if ends_pass(&e) {
                        warn!(error = %e, "fencing nodes abandoned: {}", if e.is_fenced() { LEADERSHIP_LOST } else { NO_ANSWER });
                        return;
                    }
                    let now = Instant::now();
                    let random = crate::runtime::random_fraction();
                    let retry = self.fence_failures.failed(&node, FENCE_RETRY, e.to_string(), None, now, random);
                    warn!(node = %node, error = %e, "fencing the node of a lapsed agent heartbeat failed; retrying in {:.1}s", (retry - now).as_secs_f64());
                    *due = Some(due.map_or(retry, |d| d.min(retry)));
                }
            }
        }
    }

    /// For a Node-gone action: asks the API directly whether the Node is still absent (at most
    /// once a second per Node), so one that registered again during the pass loses nothing.
    /// Any error counts as "not known to be gone".
    async fn still_gone(&mut self, action: &NodeCleanupAction) -> bool {
        let Some(Cause::NodeGone { node }) = action.cause() else { return true };
        if self.node_checks.get(node).is_some_and(|at| at.elapsed() < Duration::from_secs(1)) {
            return true;
        }
        match self.cluster.node_present(node).await {
            Ok(false) => {
                self.node_checks.insert(node.clone(), Instant::now());
                true
            }
            Ok(true) => {
                info!(node = %node, "the Node exists again; nothing of it is released");
                false
            }
            Err(e) => {
                warn!(node = %node, error = %e, "cannot confirm the Node is gone; not acting on it this pass");
                false
            }
        }
    }

    /// Carries out one action; Break (with the write that ended it) when the rest of the pass
    /// must be abandoned: nothing more is sent, not even the finalizer removal after a PV's
    /// deletion.
    async fn execute(&mut self, action: NodeCleanupAction, pvs: &BTreeMap<&str, &LocalPv>) -> ControlFlow<ApiError> {
        match action {
            NodeCleanupAction::DeleteClaim { pv, claim, cause } => {
                if self.once.claims_deleted.contains(&claim.uid) {
                    debug!(pv = %pv, claim = %claim.name, "claim already deleted; waiting for it to go");
                    return Continue(());
                }
                if let Err(e) = self.cluster.delete_claim(&claim.namespace, &claim.name, &claim.uid).await {
                    return self.failed("delete_claim", &cause, e, |e| {
                        warn!(pv = %pv, error = %e, "deleting the claim failed; will retry");
                    });
                }
                self.once.claims_deleted.insert(claim.uid.clone());
                self.metrics.node_cleanup_action("delete_claim", cause_label(&cause), true);
                let note = format!(
                    "claim deleted because its local PV {pv} cannot be used again: {cause}; its owner \
                     (a StatefulSet) can re-create it and get a volume on a live node"
                );
                info!(claim = %format!("{}/{}", claim.namespace, claim.name), pv = %pv, "{note}");
                let reference = claim_reference(&claim.namespace, &claim.name, &claim.uid);
                self.emit(&reference, true, reason(&cause), "DeleteClaim", note.clone()).await?;
                self.emit(
                    &pv_reference(&pv, pvs.get(pv.as_str()).map(|p| p.uid.as_str())),
                    true,
                    reason(&cause),
                    "DeleteClaim",
                    note,
                )
                .await
            }
            NodeCleanupAction::DeletePv { name, uid, resource_version, provisioned_by, cause } => {
                // Upstream's PV delete counters are by phase.
                let phase = pvs.get(name.as_str()).map_or("", |pv| pv.phase.as_str());
                if let Err(e) = self.cluster.delete_pv(&name, &uid, Some(&resource_version)).await {
                    if !e.is_fenced() {
                        self.metrics.node_cleanup_pv_delete(phase, false);
                    }
                    return self.failed("delete_pv", &cause, e, |e| {
                        warn!(pv = %name, error = %e, "deleting the PV failed (changed meanwhile?); will retry");
                    });
                }
                self.metrics.node_cleanup_action("delete_pv", cause_label(&cause), true);
                self.metrics.node_cleanup_pv_delete(phase, true);
                let note = format!("PV deleted: {cause}; its data is not reachable, nothing is wiped");
                info!(pv = %name, "{note}");
                self.emit(&pv_reference(&name, Some(&uid)), false, reason(&cause), "DeletePV", note).await?;
                let released =
                    self.cluster.remove_finalizer_if(&name, &uid, FINALIZER_WIPE, Some(&provisioned_by)).await;
                match released {
                    Err(e) if ends_pass(&e) => Break(e),
                    // The next pass sees the PV being deleted and releases the finalizer then.
                    Err(e) => {
                        warn!(pv = %name, error = %e, "releasing our finalizer failed (taken over meanwhile?); will retry");
                        Continue(())
                    }
                    Ok(()) => Continue(()),
                }
            }
            NodeCleanupAction::ReleaseFinalizer { name, uid, provisioned_by, cause } => {
                let released =
                    self.cluster.remove_finalizer_if(&name, &uid, FINALIZER_WIPE, Some(&provisioned_by)).await;
                if let Err(e) = released {
                    return self.failed("release_finalizer", &cause, e, |e| {
                        warn!(pv = %name, error = %e, "releasing our finalizer failed; will retry");
                    });
                }
                info!(pv = %name, "wipe finalizer released: {cause}; no agent can wipe it");
                self.metrics.node_cleanup_action("release_finalizer", cause_label(&cause), true);
                Continue(())
            }
            NodeCleanupAction::Keep { name, why } => {
                let key = keep_key(&name, pvs);
                if !self.once.kept_reported.insert(key.clone()) {
                    return Continue(());
                }
                warn!(pv = %name, "PV kept: {why}");
                let flow = self
                    .emit(
                        &pv_reference(&name, pvs.get(name.as_str()).map(|p| p.uid.as_str())),
                        true,
                        "VolumeKept",
                        "DeletePV",
                        format!("PV kept: {why}"),
                    )
                    .await;
                if flow.is_break() {
                    self.once.kept_reported.remove(&key); // Not published: published when we lead again.
                }
                flow
            }
        }
    }

    /// A failed action: counted as a failure unless the fence kept it from being sent; Break
    /// when the pass must end, else `log` says it is retried on the next pass.
    fn failed(&self, action: &str, cause: &Cause, e: ApiError, log: impl FnOnce(&ApiError)) -> ControlFlow<ApiError> {
        if !e.is_fenced() {
            self.metrics.node_cleanup_action(action, cause_label(cause), false);
        }
        if ends_pass(&e) {
            return Break(e);
        }
        log(&e);
        Continue(())
    }

    /// Publishes one of our Events; Break when the pass must end (fenced, or no answer).
    async fn emit(
        &self,
        regarding: &ObjectReference,
        warning: bool,
        reason: &str,
        action: &str,
        note: String,
    ) -> ControlFlow<ApiError> {
        match self.cluster.try_event(regarding, warning, reason, action, note).await {
            Err(e) if ends_pass(&e) => Break(e),
            Err(e) => {
                warn!(reason, error = %e, "could not publish event");
                Continue(())
            }
            Ok(()) => Continue(()),
        }
    }
}

/// What is done (or reported) once per occurrence: remembered while the plan still holds it,
/// forgotten as soon as a pass no longer plans it, so memory holds only what is under way and
/// something that comes back is handled again.
#[derive(Debug, Default)]
struct Once {
    /// UIDs of claims deleted: a claim held by a pod stays Terminating (its PV Bound, so its
    /// deletion still planned) and is neither deleted nor reported again while it does.
    claims_deleted: BTreeSet<String>,
    /// Kept PVs (`NodeCleanupAction::Keep`) already reported, by `keep_key`.
    kept_reported: BTreeSet<String>,
}

impl Once {
    /// Forgets what `actions`, a pass's whole plan, no longer holds: the claim is gone (or its
    /// Node came back), the PV is no longer kept.
    fn retain_planned(&mut self, actions: &[NodeCleanupAction], pvs: &BTreeMap<&str, &LocalPv>) {
        let mut claims = BTreeSet::new();
        let mut kept = BTreeSet::new();
        for action in actions {
            match action {
                NodeCleanupAction::DeleteClaim { claim, .. } => {
                    claims.insert(claim.uid.as_str());
                }
                NodeCleanupAction::Keep { name, .. } => {
                    kept.insert(keep_key(name, pvs));
                }
                _ => {}
            }
        }
        self.claims_deleted.retain(|uid| claims.contains(uid.as_str()));
        self.kept_reported.retain(|key| kept.contains(key));
    }
}

/// A kept PV by name and UID: a PV re-created under the same name is another occurrence.
fn keep_key(name: &str, pvs: &BTreeMap<&str, &LocalPv>) -> String {
    format!("{name}/{}", pvs.get(name).map_or("", |pv| pv.uid.as_str()))
}

/// The planner's view of a watched Node.
fn node_view(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> NodeView {
    NodeView {
        name: meta.name.clone().unwrap_or_default(),
        hostname: meta.labels.as_ref().and_then(|l| l.get(LABEL_HOSTNAME)).cloned(),
    }
}

fn reason(cause: &Cause) -> &'static str {
    match cause {
        Cause::NodeGone { .. } => "NodeGone",
        Cause::Stale { .. } => "VolumeStale",
    }
}

fn cause_label(cause: &Cause) -> &'static str {
    match cause {
        Cause::NodeGone { .. } => "node_gone",
        Cause::Stale { .. } => "stale",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::cluster::node_cleanup::ClaimRef;

    fn local_pv(name: &str, uid: &str) -> LocalPv {
        LocalPv {
            name: name.into(),
            uid: uid.into(),
            resource_version: "1".into(),
            class: "local".into(),
            phase: "Released".into(),
            reclaim_policy: "Retain".into(),
            claim: None,
            node: "gone".into(),
            node_label: None,
            deleting: false,
            has_wipe_finalizer: true,
            stale_since: None,
            moved_to: None,
            provisioned_by: "local-volume-provisioner-gone-u".into(),
        }
    }

    fn delete_claim(uid: &str) -> NodeCleanupAction {
        let claim = ClaimRef { namespace: "ns".into(), name: format!("claim-{uid}"), uid: uid.into() };
        NodeCleanupAction::DeleteClaim {
            pv: format!("pv-{uid}"),
            claim,
            cause: Cause::NodeGone { node: "gone".into() },
        }
    }

    fn keep(name: &str) -> NodeCleanupAction {
        NodeCleanupAction::Keep { name: name.into(), why: "Retain".into() }
    }

    #[test]
    fn what_was_done_once_is_forgotten_when_no_longer_planned() {
        let (kept_1, kept_1_again) = (local_pv("kept", "uid-1"), local_pv("kept", "uid-2"));
        let pvs = BTreeMap::from([("kept", &kept_1)]);
        let mut once = Once::default();
        once.claims_deleted.extend(["c1".to_string(), "c2".to_string()]);
        once.kept_reported.insert(keep_key("kept", &pvs));

        // Still planned: remembered (a Terminating claim is not deleted or reported again).
        once.retain_planned(&[delete_claim("c1"), delete_claim("c2"), keep("kept")], &pvs);
        assert_eq!(once.claims_deleted, BTreeSet::from(["c1".to_string(), "c2".to_string()]));
        assert_eq!(once.kept_reported, BTreeSet::from(["kept/uid-1".to_string()]));

        // c2 is gone and the PV is no longer kept: both forgotten.
        once.retain_planned(&[delete_claim("c1")], &pvs);
        assert_eq!(once.claims_deleted, BTreeSet::from(["c1".to_string()]));
        assert!(once.kept_reported.is_empty());

        // A PV re-created under the same name is another occurrence.
        once.kept_reported.insert(keep_key("kept", &pvs));
        once.retain_planned(&[keep("kept")], &BTreeMap::from([("kept", &kept_1_again)]));
        assert!(once.kept_reported.is_empty());

        // A pass that plans nothing forgets everything.
        once.retain_planned(&[], &pvs);
        assert!(once.claims_deleted.is_empty());
    }

    #[test]
    fn a_watched_node_is_seen_by_name_and_hostname_label() {
        let mut meta = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("n1".into()),
            labels: Some(BTreeMap::from([(LABEL_HOSTNAME.to_string(), "n1-host".to_string())])),
            ..Default::default()
        };
        assert_eq!(node_view(&meta), NodeView { name: "n1".into(), hostname: Some("n1-host".into()) });
        meta.labels = None;
        assert_eq!(node_view(&meta), NodeView { name: "n1".into(), hostname: None });
    }
}

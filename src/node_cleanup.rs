//! `node-cleanup`: the cluster-wide Deployment that releases local PVs (and their claims) of
//! Nodes that are gone for good, or that the agent of a re-created Node found stale. Every
//! replica watches PVs and tracks absent Nodes, so a failover does not restart the grace
//! period; only the holder of the Lease acts. Every write is fenced: right before it goes out
//! (after the rate limiter), leadership must hold for the write's whole deadline, and the first
//! refusal abandons the rest of the pass. Each pass lists Nodes afresh; when they cannot be
//! listed, nothing is done.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::ControlFlow::{self, Break, Continue};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::Store;
use tokio::sync::Notify;
use tracing::{debug, info, warn};

use crate::admin::{Readiness, parse_listen_address, serve};
use crate::api::{ApiError, ClientOptions, Cluster, claim_reference, pv_reference};
use crate::core::naming::{FINALIZER_WIPE, LABEL_HOSTNAME};
use crate::core::node_cleanup::{
    Cause, LocalPv, NodeCleanupAction, NodeView, absent_nodes, plan_node_cleanup, stale_pvs,
};
use crate::core::settle::Settler;
use crate::leader::{self, Leadership, LeaseOptions};
use crate::metrics::{Metrics, Role};

/// Settings of `node-cleanup`.
#[derive(Debug, Clone)]
pub struct NodeCleanupOptions {
    /// StorageClasses opted in; PVs of other classes are never touched.
    pub classes: BTreeSet<String>,
    /// How long a Node must be gone (or a PV stale) before its claims and PVs are released.
    pub grace: Duration,
    /// Safety-net pass period (passes also follow PV changes and grace deadlines).
    pub resync: Duration,
    /// The leader Lease.
    pub lease: LeaseOptions,
    /// API connection settings.
    pub client: ClientOptions,
    /// Admin server address.
    pub listen_address: String,
    /// Path of the metrics endpoint.
    pub metrics_path: String,
}

/// Why node-cleanup stopped.
#[derive(Debug, thiserror::Error)]
pub enum NodeCleanupError {
    /// The API could not be used at start.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The admin server could not start.
    #[error(transparent)]
    Admin(#[from] crate::admin::AdminError),
    /// The PV watch never became ready.
    #[error("watching persistentvolumes: {0}")]
    Watch(String),
    /// Nothing to do: no class opted in.
    #[error("no StorageClass opted in: pass --storage-classes (node-cleanup never acts on other classes)")]
    NoClasses,
}

/// Runs until SIGTERM or SIGINT; releases the Lease on the way out.
pub async fn run(opts: NodeCleanupOptions) -> Result<(), NodeCleanupError> {
    if opts.classes.is_empty() {
        return Err(NodeCleanupError::NoClasses);
    }
    let metrics = Metrics::for_role(Role::NodeCleanup);
    let readiness = Readiness::new("starting: waiting for the PV watch");
    serve(parse_listen_address(&opts.listen_address)?, opts.metrics_path.clone(), metrics.clone(), readiness.clone())
        .await?;
    let cluster =
        Cluster::connect_as(&opts.client, "node-cleanup", &opts.lease.identity).await?.with_metrics(metrics.clone());
    info!(
        classes = ?opts.classes,
        grace_s = opts.grace.as_secs(),
        identity = %opts.lease.identity,
        "node-cleanup starting"
    );

    let changed = Arc::new(Notify::new());
    let (pv_store, pv_events) = cluster.watch_pvs(None);
    crate::runtime::forward_events("persistentvolumes", pv_events, changed.clone());
    pv_store.wait_until_ready().await.map_err(|e| NodeCleanupError::Watch(e.to_string()))?;
    readiness.set(None);
    // Candidates only once they can see PVs: a replica whose watch cannot sync never holds the
    // Lease while doing nothing.
    let elector = {
        let (metrics, changed) = (metrics.clone(), changed.clone());
        leader::spawn(cluster.for_leader_election(), opts.lease.clone(), move |leads| {
            metrics.set_leader(leads);
            if leads {
                changed.notify_one(); // Act at once on what is already due.
            } else {
                warn!("leadership lost; not acting until it is regained");
            }
        })
    };

    let request_deadline = opts.lease.request_deadline();
    let cluster = {
        let leadership = elector.leadership.clone();
        cluster.with_fence(request_deadline, move |d| leadership.is_leader_for(d))
    };

    let mut worker = Worker {
        cluster,
        metrics,
        readiness,
        leadership: elector.leadership.clone(),
        request_deadline,
        pv_store,
        opts: opts.clone(),
        absent: Settler::default(),
        stale: Settler::default(),
        reported: BTreeSet::new(),
        absent_logged: BTreeSet::new(),
        claims_deleted: BTreeSet::new(),
        node_checks: BTreeMap::new(),
    };
    let mut shutdown = crate::runtime::Shutdown::install();
    let mut next_due: Option<Instant> = None;
    loop {
        worker.pass(&mut next_due).await;
        let wake = next_due.map(tokio::time::Instant::from_std);
        tokio::select! {
            _ = shutdown.signalled() => break,
            _ = tokio::time::sleep(opts.resync) => debug!("periodic pass"),
            _ = changed.notified() => {
                // Let a burst of PV events settle into one pass.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            _ = crate::runtime::sleep_until_opt(wake) => debug!("pass for a grace deadline"),
        }
    }
    info!("shutting down");
    elector.release().await;
    Ok(())
}

/// Logged when a pass stops because this replica no longer leads.
const LEADERSHIP_LOST: &str = "leadership lost during a pass; abandoning the rest of it";
/// Logged when a pass stops because a write outlived its deadline.
const NO_ANSWER: &str = "a write got no answer within its deadline; abandoning the rest of the pass";

/// Whether a write's failure ends the pass: refused by the fence (leadership lost), or abandoned
/// at its deadline (whether it was applied is unknown: the next pass looks again).
fn ends_pass(e: &ApiError) -> bool {
    e.is_fenced() || e.is_deadline()
}

struct Worker {
    /// Fenced on `leadership` for every write.
    cluster: Cluster,
    metrics: Metrics,
    readiness: Readiness,
    leadership: Leadership,
    /// The deadline of each write, for which leadership must still hold when it goes out.
    request_deadline: Duration,
    pv_store: Store<PersistentVolume>,
    opts: NodeCleanupOptions,
    /// Since when each Node key named by an opted-in PV has been absent.
    absent: Settler,
    /// Since when each opted-in PV's stale mark has been seen (our clock, not the node's).
    stale: Settler,
    /// UIDs of claims already deleted: a claim held by a pod stays Terminating, and is neither
    /// deleted nor reported again.
    claims_deleted: BTreeSet<String>,
    /// When each gone Node was last confirmed absent by a direct query, this pass.
    node_checks: BTreeMap<String, Instant>,
    /// Things already reported (logged and evented once).
    reported: BTreeSet<String>,
    /// Absent Nodes already logged.
    absent_logged: BTreeSet<String>,
}

impl Worker {
    async fn pass(&mut self, next_due: &mut Option<Instant>) {
        let pvs: Vec<LocalPv> = self.pv_store.state().iter().filter_map(|pv| LocalPv::from_pv(pv)).collect();
        let nodes = match self.cluster.list_node_metadata().await {
            Ok(list) => list
                .into_iter()
                .map(|n| NodeView {
                    hostname: n.metadata.labels.as_ref().and_then(|l| l.get(LABEL_HOSTNAME)).cloned(),
                    name: n.metadata.name.unwrap_or_default(),
                })
                .collect::<Vec<_>>(),
            Err(e) => {
                // Without a fresh list of Nodes nothing can be known to be gone: act on nothing.
                self.metrics.nodes_unreadable();
                warn!(error = %e, "cannot list Nodes; nothing is done until they can be read");
                self.readiness.set_detail(Some(format!("cannot list Nodes: {e}")));
                *next_due = Some(Instant::now() + self.opts.resync);
                return;
            }
        };
        self.readiness.set_detail(None);
        if nodes.is_empty() {
            // This process runs on a Node, so an empty list is a wrong answer, not a dead cluster.
            if self.reported.insert("no-nodes".into()) {
                warn!("the API listed no Nodes at all; acting on nothing until it lists some");
            }
            return;
        }
        self.reported.remove("no-nodes");
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
        if actions.is_empty() {
            return;
        }
        if !self.leadership.is_leader() {
            debug!(due = actions.len(), "actions due, but another replica leads");
            return;
        }
        let by_name: BTreeMap<&str, &LocalPv> = pvs.iter().map(|pv| (pv.name.as_str(), pv)).collect();
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
                if self.claims_deleted.contains(&claim.uid) {
                    debug!(pv = %pv, claim = %claim.name, "claim already deleted; waiting for it to go");
                    return Continue(());
                }
                if let Err(e) = self.cluster.delete_claim(&claim.namespace, &claim.name, &claim.uid).await {
                    return self.failed("delete_claim", &cause, e, |e| {
                        warn!(pv = %pv, error = %e, "deleting the claim failed; will retry");
                    });
                }
                self.claims_deleted.insert(claim.uid.clone());
                self.metrics.node_cleanup_action("delete_claim", cause_label(&cause), true);
                let note = format!(
                    "claim deleted because its local PV {pv} cannot be used again: {cause}; its owner \
                     (a StatefulSet) can re-create it and get a volume on a live node"
                );
                info!(claim = %format!("{}/{}", claim.namespace, claim.name), pv = %pv, "{note}");
                let reference = claim_reference(&claim.namespace, &claim.name, &claim.uid);
                self.emit(&reference, true, reason(&cause), "DeleteClaim", note.clone()).await?;
                self.emit(&pv_reference(&pv), true, reason(&cause), "DeleteClaim", note).await
            }
            NodeCleanupAction::DeletePv { name, uid, resource_version, provisioned_by, cause } => {
                if let Err(e) = self.cluster.delete_pv(&name, &uid, Some(&resource_version)).await {
                    return self.failed("delete_pv", &cause, e, |e| {
                        warn!(pv = %name, error = %e, "deleting the PV failed (changed meanwhile?); will retry");
                    });
                }
                self.metrics.node_cleanup_action("delete_pv", cause_label(&cause), true);
                let note = format!("PV deleted: {cause}; its data is not reachable, nothing is wiped");
                info!(pv = %name, "{note}");
                self.emit(&pv_reference(&name), false, reason(&cause), "DeletePV", note).await?;
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
                let key = format!("keep/{name}/{}", pvs.get(name.as_str()).map_or("", |pv| pv.uid.as_str()));
                if !self.reported.insert(key.clone()) {
                    return Continue(());
                }
                warn!(pv = %name, "PV kept: {why}");
                let flow =
                    self.emit(&pv_reference(&name), true, "VolumeKept", "DeletePV", format!("PV kept: {why}")).await;
                if flow.is_break() {
                    self.reported.remove(&key); // Not published: published when we lead again.
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

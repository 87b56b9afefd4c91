//! The cleanup planner: decides, from the PV objects alone, which volumes must be wiped, which
//! PVs need our finalizer, and which cleanup requests to refuse. The PV object (its phase, its
//! deletion timestamp and our finalizer) is the durable record, so after any crash the same
//! decisions come out again and an interrupted wipe is simply done again.

use std::collections::BTreeSet;

use crate::core::volumes::naming::{
    ANN_CLEANUP, ANN_CLEANUP_REQUESTED_AT, ANN_CLEANUP_RESULT, ANN_DISK_FAILING, ANN_IDENTITY_CONFIRMED,
    ANN_VOLUME_IDENTITY, ANN_VOLUME_MISSING, ANN_VOLUME_MOVED_TO, ANN_VOLUME_STALE, CLEANUP_REQUESTED, FINALIZER_WIPE,
};
use crate::core::volumes::pv_facts::PvFacts;

/// What the cleanup planner needs to know about one of our PVs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PvState {
    /// PV name.
    pub name: String,
    /// PV UID: wipes and deletions are tied to this very object, never to a successor.
    pub uid: String,
    /// For preconditions on withdrawal.
    pub resource_version: String,
    /// `status.phase`.
    pub phase: String,
    /// `spec.persistentVolumeReclaimPolicy`.
    pub reclaim_policy: String,
    /// A deletion timestamp is set.
    pub deleting: bool,
    /// Our finalizer is present.
    pub has_finalizer: bool,
    /// A claim was bound to it at some point (claimRef set).
    pub claimed: bool,
    /// An administrator asked for a wipe.
    pub cleanup_requested: bool,
    /// Result recorded for an earlier cleanup request.
    pub cleanup_result: Option<String>,
    /// When the cleanup was last requested (see naming::ANN_CLEANUP_REQUESTED_AT).
    pub cleanup_requested_at: Option<String>,
    /// `spec.local.path`.
    pub host_path: String,
    /// `spec.storageClassName`.
    pub class: String,
    /// Recorded volume identity, absent on PVs upstream made.
    pub identity: Option<String>,
    /// The identity an operator confirmed may be wiped when it cannot be proven to be the
    /// recorded disk (see core::identity::disk_identity).
    pub identity_confirmed: Option<String>,
    /// Our volume-missing annotation is set.
    pub flagged_missing: bool,
    /// Our volume-stale annotation is set (PV of an earlier incarnation of the Node).
    pub flagged_stale: bool,
    /// Where on this node its disk was last found when not at its path (volume-moved-to).
    pub moved_to: Option<String>,
    /// Why its disk is failing, as the agent last annotated it (core::health::disk_health).
    pub disk_failing: Option<String>,
    /// The claim bound to it: (namespace, name, UID), to tell its owner about its disk.
    pub claim: Option<(String, String, String)>,
    /// Its node affinity honours its volume fence (core::fence::volume_fence::honours_fence).
    pub honours_fence: bool,
    /// `spec.capacity.storage` in bytes, when readable.
    pub capacity_bytes: Option<u64>,
    /// The key an encrypted volume's PV names (core::volumes::encryption), or why its annotation is
    /// unreadable: its wipe destroys that key first, and refuses while it cannot tell which.
    pub encryption: Option<Result<String, String>>,
    /// The wipes of its volume before it was published, newest first (its last-wipe and
    /// earlier-wipes annotations, core::wipe::wipe_history::earlier_wipes): carried to the PV that
    /// follows its own wipe.
    pub wipe_history: Vec<String>,
}

impl PvState {
    /// Whether a claim uses or used the PV, so its disk may hold a tenant's data: a claimRef,
    /// or any phase past Available/Pending.
    pub fn used_by_a_claim(&self) -> bool {
        self.claimed || !matches!(self.phase.as_str(), "Available" | "Pending" | "")
    }

    /// Extracts the fields the planner looks at.
    pub fn from_pv(pv: &PvFacts) -> Self {
        let meta = &pv.metadata;
        let ann = |k: &str| pv.annotation(k).cloned();
        let spec = &pv.spec;
        PvState {
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            phase: pv.phase().to_string(),
            reclaim_policy: spec.persistent_volume_reclaim_policy.clone().unwrap_or_default(),
            deleting: meta.deletion_timestamp.is_some(),
            has_finalizer: meta.finalizers.as_ref().is_some_and(|f| f.iter().any(|f| f == FINALIZER_WIPE)),
            claimed: spec.claim_ref.is_some(),
            cleanup_requested: ann(ANN_CLEANUP).as_deref() == Some(CLEANUP_REQUESTED),
            cleanup_result: ann(ANN_CLEANUP_RESULT),
            cleanup_requested_at: ann(ANN_CLEANUP_REQUESTED_AT),
            host_path: pv.local_path().unwrap_or_default().to_string(),
            class: spec.storage_class_name.clone().unwrap_or_default(),
            identity: ann(ANN_VOLUME_IDENTITY),
            identity_confirmed: ann(ANN_IDENTITY_CONFIRMED),
            flagged_missing: ann(ANN_VOLUME_MISSING).is_some(),
            flagged_stale: ann(ANN_VOLUME_STALE).is_some(),
            moved_to: ann(ANN_VOLUME_MOVED_TO),
            disk_failing: ann(ANN_DISK_FAILING),
            claim: spec.claim_ref.as_ref().map(|c| {
                let part = |v: &Option<String>| v.clone().unwrap_or_default();
                (part(&c.namespace), part(&c.name), part(&c.uid))
            }),
            honours_fence: pv.fence_honoured,
            capacity_bytes: pv.spec.capacity_bytes,
            encryption: pv.encryption_key().transpose(),
            wipe_history: crate::core::wipe::wipe_history::earlier_wipes(
                ann(crate::core::wipe::wipe_history::ANN_LAST_WIPE).as_deref(),
                ann(crate::core::wipe::wipe_history::ANN_EARLIER_WIPES).as_deref(),
            ),
        }
    }
}

/// What to do with the PV once its volume is wiped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterWipe {
    /// Delete the PV (then drop our finalizer); discovery publishes the clean volume anew.
    DeletePv,
    /// The PV is already being deleted: drop our finalizer so it goes.
    RemoveFinalizer,
    /// No PV: a used disk whose PV is gone, wiped before discovery publishes it (wipe-first).
    Nothing,
}

/// Why a PV is left alone, reported once as a Warning event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Released with reclaim policy Recycle (upstream reason VolumeUnsupportedReclaimPolicy).
    RecyclePolicy,
    /// Released with a policy we do not know (upstream reason VolumeUnknownReclaimPolicy).
    UnknownPolicy(String),
    /// A cleanup was requested on a Bound PV: its data is in use.
    Bound,
}

impl Refusal {
    /// Event reason, upstream's where one exists.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::RecyclePolicy => "VolumeUnsupportedReclaimPolicy",
            Refusal::UnknownPolicy(_) => "VolumeUnknownReclaimPolicy",
            Refusal::Bound => "VolumeCleanupRefused",
        }
    }

    /// Whether the refusal answers an administrator's request and is recorded on the PV.
    pub fn answers_request(&self) -> bool {
        matches!(self, Refusal::Bound)
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::RecyclePolicy => write!(f, "Volume has unsupported PersistentVolumeReclaimPolicy: Recycle"),
            Refusal::UnknownPolicy(p) => write!(f, "Volume has unrecognized PersistentVolumeReclaimPolicy {p:?}"),
            Refusal::Bound => write!(f, "refused: the PV is Bound to a claim; delete the claim first"),
        }
    }
}

/// One cleanup step for the executors.
#[derive(Debug, Clone, PartialEq, Eq)]
// A handful of short-lived actions per pass: boxing the PV of `Wipe` would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum CleanupAction {
    /// Put our finalizer on a PV that lacks it (made by upstream or an older version).
    AddFinalizer { name: String },
    /// Wipe the PV's volume, then finish as `after` says.
    Wipe { pv: PvState, after: AfterWipe },
    /// Delete an Available PV whose cleanup was requested, only if unchanged since we saw it,
    /// so it cannot get bound during the wipe; the finalizer keeps it until the wipe is done.
    Withdraw { name: String, resource_version: String },
    /// A PV deleted by hand that never had a claim: nothing to wipe, let it go.
    ReleaseFinalizer { name: String, uid: String },
    /// Leave the PV alone and say why.
    Refuse { name: String, refusal: Refusal },
}

/// Plans cleanup for our PVs. `busy` holds the UIDs with a wipe running or backing off after a
/// failure; they get no action. Sorted by PV name.
pub fn plan_cleanup(pvs: &[PvState], busy: &BTreeSet<String>) -> Vec<CleanupAction> {
    let mut sorted: Vec<&PvState> = pvs.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let mut actions = Vec::new();
    for pv in sorted {
        if busy.contains(&pv.uid) {
            continue;
        }
        if let Some(action) = plan_one(pv) {
            actions.push(action);
        }
    }
    actions
}

fn plan_one(pv: &PvState) -> Option<CleanupAction> {
    let wipe = |after| Some(CleanupAction::Wipe { pv: pv.clone(), after });
    let refuse = |refusal| Some(CleanupAction::Refuse { name: pv.name.clone(), refusal });
    if pv.deleting {
        if !pv.has_finalizer {
            return None; // Not held by us; it is going away.
        }
        return match pv.phase.as_str() {
            // Still in use by a pod: kubernetes' own pv-protection keeps it; wipe after release.
            "Bound" => None,
            _ if pv.claimed || pv.cleanup_requested => wipe(AfterWipe::RemoveFinalizer),
            _ => Some(CleanupAction::ReleaseFinalizer { name: pv.name.clone(), uid: pv.uid.clone() }),
        };
    }
    if !pv.has_finalizer {
        return Some(CleanupAction::AddFinalizer { name: pv.name.clone() });
    }
    match pv.phase.as_str() {
        "Released" | "Failed" if pv.cleanup_requested => wipe(AfterWipe::DeletePv),
        "Released" => match pv.reclaim_policy.as_str() {
            "Delete" => wipe(AfterWipe::DeletePv),
            "Retain" => None,
            "Recycle" => refuse(Refusal::RecyclePolicy),
            other => refuse(Refusal::UnknownPolicy(other.to_string())),
        },
        "Available" | "Pending" if pv.cleanup_requested && !pv.claimed => {
            Some(CleanupAction::Withdraw { name: pv.name.clone(), resource_version: pv.resource_version.clone() })
        }
        "Bound" if pv.cleanup_requested => {
            let refusal = Refusal::Bound;
            // Recorded once; the annotation is the answer the administrator reads.
            (pv.cleanup_result.as_deref() != Some(refusal.to_string().as_str())).then_some(())?;
            refuse(refusal)
        }
        _ => None,
    }
}

#[cfg(test)]
#[path = "cleanup_tests.rs"]
mod tests;

//! The volume fence: while a PV's path provably does not hold its own disk, no pod may get that
//! path mounted. Disks mounted by kernel name (`/dev/sdb1` in fstab) come back in another order
//! after a reboot, and each mount point then holds another tenant's disk; kubelet bind-mounts
//! whatever is there.
//!
//! The fence is a label on this node that the PV's own node affinity forbids: every PV the
//! agent makes requires `fence.local-static-provisioner.io/<pv>` and
//! `local-static-provisioner.io/volumes-unverified` to be absent from its node, in every term.
//! kubelet checks a PV's node affinity against its node's labels right before each mount or
//! block mapping, and the scheduler before placing a pod, so a fenced volume is mounted by no
//! new pod, on its node or any other. A label is kept by the API server: it holds across
//! reboots and while the agent is down, and an agent that stops sets the node-wide one so that
//! nothing newly mounts the node's volumes until the next agent has checked their disks.
//! Pods already running keep the mount they have (kubelet checks only when it mounts).
//!
//! Pure: the agent feeds what it found at each path and the node's labels, and applies the
//! label changes and events returned.

use std::collections::{BTreeMap, BTreeSet};

use crate::core::cluster::succession::DiskCheck;
pub use crate::core::fence::fence_label::{
    AGENT_STOPPED, FENCE_PREFIX, FenceReason, LABEL_VOLUMES_UNVERIFIED, fence_key, fence_requirements, honours_fence,
    strip_fence_requirements,
};

/// Whether a pod could still get the PV mounted, so its fence matters: not one being deleted
/// that no claim ever used (the PV controller never binds a terminating PV; a withdrawn PV
/// lingers a moment under our finalizer, and fencing it would only tell its end as a fence).
pub fn may_be_mounted(pv: &crate::core::wipe::cleanup::PvState) -> bool {
    !pv.deleting || pv.used_by_a_claim()
}

/// What the pass found at a PV's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Its own disk, or one nothing proves is another (no stable ID, unrecorded identity).
    Own,
    /// A disk that is provably not its own.
    NotItsDisk,
    /// Nothing mounted, no device.
    Missing,
    /// The check did not answer (an unresponsive or slow disk) or was not made this pass.
    NoAnswer,
    /// Its own disk, but the key of its encrypted volume could not be loaded this pass.
    KeyUnavailable,
}

impl From<DiskCheck> for Seen {
    fn from(check: DiskCheck) -> Seen {
        match check {
            DiskCheck::Same | DiskCheck::Plausible | DiskCheck::Unrecorded | DiskCheck::Unverified => Seen::Own,
            DiskCheck::Different | DiskCheck::Moved => Seen::NotItsDisk,
            DiskCheck::Missing => Seen::Missing,
        }
    }
}

/// One PV of this node, as the fence planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceInput {
    /// PV name.
    pub name: String,
    /// Whether its node affinity honours its fence label (see `honours_fence`).
    pub honours: bool,
    /// What this pass found at its path.
    pub seen: Seen,
}

/// What to change on the node, and whom to tell.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FencePlan {
    /// Label changes on this node: a value to set, or `None` to remove the label.
    pub labels: BTreeMap<String, Option<String>>,
    /// PVs fenced by this plan, or fenced for another reason than before.
    pub fenced: Vec<(String, FenceReason)>,
    /// PVs whose fence this plan lifts.
    pub lifted: Vec<String>,
    /// Every PV fenced once the plan is applied, with why.
    pub in_force: BTreeMap<String, FenceReason>,
}

/// Plans the fences of one pass from what it found at every PV's path (this node's and an
/// earlier incarnation's) and the node's labels. Level-triggered: the labels it asks for depend
/// only on these inputs, so a label removed by hand, or a change missed, is put right by the
/// next pass.
///
/// - A PV whose path provably holds another disk, or nothing, is fenced; one whose own disk is
///   there (or nothing proves otherwise) is not.
/// - A PV whose disk did not answer keeps its fence, or its absence, except while the node-wide
///   fence is up: then it gets its own `unverified` fence, since nobody has checked it since
///   the agent started.
/// - The node-wide fence is lifted by the first pass that gets here: every PV then has the
///   fence it needs of its own.
/// - Fence labels of PVs that no longer exist, or whose affinity cannot honour them, are removed:
///   nothing is left on the node to grow.
pub fn plan_fences(pvs: &[FenceInput], node_labels: &BTreeMap<String, String>) -> FencePlan {
    let node_wide = node_labels.contains_key(LABEL_VOLUMES_UNVERIFIED);
    let mut plan = FencePlan::default();
    let mut kept_keys = BTreeSet::new();
    let mut sorted: Vec<&FenceInput> = pvs.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    for pv in sorted {
        let Some(key) = fence_key(&pv.name).filter(|_| pv.honours) else { continue };
        let current = node_labels.get(&key).map(|v| FenceReason::from_label_value(v));
        let wanted = match pv.seen {
            Seen::Own => None,
            Seen::NotItsDisk => Some(FenceReason::NotItsDisk),
            Seen::Missing => Some(FenceReason::DiskMissing),
            Seen::KeyUnavailable => Some(FenceReason::KeyUnavailable),
            Seen::NoAnswer if node_wide => current.or(Some(FenceReason::Unverified)),
            Seen::NoAnswer => current,
        };
        match (current, wanted) {
            (None, None) => {}
            (Some(_), None) => {
                plan.labels.insert(key.clone(), None);
                plan.lifted.push(pv.name.clone());
            }
            (current, Some(reason)) => {
                if node_labels.get(&key).map(String::as_str) != Some(reason.label_value()) {
                    plan.labels.insert(key.clone(), Some(reason.label_value().to_string()));
                }
                if current != Some(reason) {
                    plan.fenced.push((pv.name.clone(), reason));
                }
                plan.in_force.insert(pv.name.clone(), reason);
            }
        }
        kept_keys.insert(key);
    }
    for key in node_labels.keys().filter(|k| k.starts_with(FENCE_PREFIX)) {
        if !kept_keys.contains(key) {
            plan.labels.insert(key.clone(), None);
        }
    }
    if node_wide {
        plan.labels.insert(LABEL_VOLUMES_UNVERIFIED.to_string(), None);
    }
    plan
}

/// What a fence's note says beyond its reason: whose disk is at the PV's path, and where the
/// PV's own disk is now (each when this node shows it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FenceFacts {
    /// The PV whose disk is at this PV's path.
    pub disk_there_of: Option<String>,
    /// The path on this node that holds this PV's own disk.
    pub own_disk_at: Option<String>,
}

/// Which fences in force to tell their owners about, and what is then told, from what was told
/// before (`told`), this pass's plan and what this pass knows of each fenced PV (`facts`).
///
/// A swap passes through half-swapped states (one disk mounted at its new path, the other not
/// yet), and a pass that sees one fences with half the story; events fold only identical notes,
/// so the owner would keep reading that half. So:
/// - a PV newly fenced, or fenced for another reason, is told, with what is known now;
/// - a fence whose facts changed to something known (a disk now recognised at its path, its own
///   disk found elsewhere, or at another place) is told again; a fact no longer known is not
///   (a slow disk is not news, and the owner keeps the better story);
/// - a fence in force that nobody here told (the agent restarted) is recorded, not told again;
/// - lifted fences are forgotten: what is returned holds only the fences in force.
pub fn fences_to_tell(
    told: &BTreeMap<String, (FenceReason, FenceFacts)>,
    plan: &FencePlan,
    facts: &BTreeMap<String, FenceFacts>,
) -> (Vec<String>, BTreeMap<String, (FenceReason, FenceFacts)>) {
    let mut tell = Vec::new();
    let mut now = BTreeMap::new();
    for (name, reason) in &plan.in_force {
        let known = facts.get(name).cloned().unwrap_or_default();
        let newly = plan.fenced.iter().any(|(n, _)| n == name);
        let kept = match told.get(name) {
            _ if newly => {
                tell.push(name.clone());
                known
            }
            Some((was, before)) if was == reason => {
                let learnt = |now: &Option<String>, before: &Option<String>| now.is_some() && now != before;
                if learnt(&known.disk_there_of, &before.disk_there_of)
                    || learnt(&known.own_disk_at, &before.own_disk_at)
                {
                    tell.push(name.clone());
                    known
                } else {
                    before.clone()
                }
            }
            _ => known,
        };
        now.insert(name.clone(), (*reason, kept));
    }
    (tell, now)
}

/// The label an agent sets on its node when it stops, when any of its PVs honours it.
pub fn stop_label(pvs: &[FenceInput]) -> Option<(String, String)> {
    pvs.iter().any(|pv| pv.honours).then(|| (LABEL_VOLUMES_UNVERIFIED.to_string(), AGENT_STOPPED.to_string()))
}

#[cfg(test)]
#[path = "volume_fence_tests.rs"]
mod tests;

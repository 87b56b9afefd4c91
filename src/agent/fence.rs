//! Volume fences (core::fence::volume_fence): the labels on this node that keep pods from mounting a PV
//! whose path does not hold its own disk, set and lifted from what each pass found at every
//! PV's path, the node-wide one set when the agent stops, and the PV's and claim's owners told.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tracing::{info, warn};

use super::Agent;
use crate::core::cluster::succession::DiskCheck;
use crate::core::fence::volume_fence::{
    FenceFacts, FenceInput, FenceReason, Seen, fence_key, fences_to_tell, may_be_mounted, plan_fences, stop_label,
};
use crate::core::identity::disk_identity::may_share_disk;
use crate::core::reconcile::effect_key::EffectKey;
use crate::core::volumes::presence::where_moved;
use crate::core::wipe::cleanup::PvState;

/// How long an agent tries to set the node-wide fence when it stops (kubelet's grace period is
/// 30 s and wipes still have to be stopped after it) or starts.
const NODE_WIDE_DEADLINE: Duration = Duration::from_secs(5);

/// The event action of a fence, per reason (see `follow_fences`).
fn fence_action(reason: FenceReason) -> &'static str {
    match reason {
        FenceReason::NotItsDisk => "FenceNotItsDisk",
        FenceReason::DiskMissing => "FenceDiskMissing",
        FenceReason::Unverified => "FenceUnverified",
        FenceReason::KeyUnavailable => "FenceKeyUnavailable",
    }
}

impl Agent {
    /// Sets and lifts this node's fence labels from what this pass found at each PV's path
    /// (`checks` for this node's PVs, `succession` for an earlier incarnation's), telling each
    /// PV and its claim. Another disk at a path fences it at once; an empty path only once it
    /// has stayed empty for the settle window (`missing`), as a swap passes through it. A failed
    /// write is retried with backoff; nobody is told before the labels are written.
    pub(super) async fn follow_fences(
        &mut self,
        states: &[PvState],
        predecessors: &[PvState],
        checks: &[(String, DiskCheck)],
        succession: &[(String, DiskCheck)],
        missing: &BTreeSet<String>,
        locked: &BTreeSet<String>,
    ) {
        let seen: BTreeMap<&str, DiskCheck> =
            checks.iter().chain(succession).map(|(uid, check)| (uid.as_str(), *check)).collect();
        let all: Vec<&PvState> = states.iter().chain(predecessors).filter(|pv| may_be_mounted(pv)).collect();
        let inputs: Vec<FenceInput> = all
            .iter()
            .map(|pv| FenceInput {
                name: pv.name.clone(),
                honours: pv.honours_fence,
                seen: match seen.get(pv.uid.as_str()).map(|c| Seen::from(*c)) {
                    Some(Seen::Missing) if !missing.contains(&pv.uid) => Seen::NoAnswer,
                    Some(Seen::Own) if locked.contains(&pv.name) => Seen::KeyUnavailable,
                    Some(seen) => seen,
                    None => Seen::NoAnswer,
                },
            })
            .collect();
        let labels = self.node.metadata.labels.clone().unwrap_or_default();
        let plan = plan_fences(&inputs, &labels);
        if !plan.labels.is_empty() {
            // Keyed by the change itself: a different change is due at once, the same one
            // after a failure waits for its retry deadline.
            let change: Vec<String> =
                plan.labels.iter().map(|(k, v)| format!("{k}={}", v.as_deref().unwrap_or("-"))).collect();
            let key = EffectKey::Fences(change.join(","));
            let patched = self.cluster.patch_node_labels(&self.identity.node, &plan.labels);
            let Some(Ok(node)) = self.effects.run(&key, patched).await else { return };
            self.node = node;
        }
        let in_force: Vec<(String, &'static str)> =
            plan.in_force.iter().map(|(pv, reason)| (pv.clone(), reason.label_value())).collect();
        self.metrics.set_fenced(&in_force);
        let facts: BTreeMap<String, FenceFacts> = plan
            .in_force
            .iter()
            .filter_map(|(name, reason)| {
                let pv = all.iter().find(|pv| pv.name == *name)?;
                Some((name.clone(), self.fence_facts(pv, *reason, &all)))
            })
            .collect();
        let (tell, told) = fences_to_tell(&self.fences_told, &plan, &facts);
        self.fences_told = told;
        for name in &tell {
            let (Some(pv), Some(reason)) = (all.iter().find(|pv| pv.name == *name), plan.in_force.get(name)) else {
                continue;
            };
            let note = self.fence_note(pv, *reason, &facts.get(name).cloned().unwrap_or_default());
            warn!(pv = %name, reason = reason.label_value(), "{note}");
            // One action per reason: events with the same reason, object and action fold into
            // one series that keeps its first note, and a fence that changes reason must say so.
            // A note that says more (core::fence::volume_fence::fences_to_tell) is an event of its own.
            self.tell_as(pv, true, "VolumeFenced", fence_action(*reason), note).await;
        }
        for name in &plan.lifted {
            let Some(pv) = all.iter().find(|pv| pv.name == *name) else { continue };
            let note = format!(
                "the fence of PV {name} is lifted: its own disk is at {} on node {} again (or nothing proves \
                 otherwise). Pods may mount it again; kubelet retries the ones waiting for it",
                pv.host_path, self.identity.node
            );
            info!(pv = %name, "{note}");
            self.tell_as(pv, false, "VolumeUnfenced", "Unfence", note).await;
        }
    }

    /// What this node shows of a fenced PV's disks (core::fence::volume_fence::FenceFacts): for a path that
    /// holds another disk, whose disk it is and where the PV's own disk is now.
    fn fence_facts(&self, pv: &PvState, reason: FenceReason, all: &[&PvState]) -> FenceFacts {
        if reason != FenceReason::NotItsDisk {
            return FenceFacts::default();
        }
        let here = self.marks.found_disks.iter().find(|(path, _)| *path == pv.host_path).map(|(_, id)| id.as_str());
        let owner = here.and_then(|id| {
            all.iter()
                .find(|other| other.name != pv.name && other.identity.as_deref().is_some_and(|r| may_share_disk(r, id)))
        });
        FenceFacts {
            disk_there_of: owner.map(|other| match &other.claim {
                Some((ns, claim, _)) => format!("{} (claim {ns}/{claim})", other.name),
                None => other.name.clone(),
            }),
            own_disk_at: where_moved(pv, &self.marks.found_disks),
        }
    }

    /// What the owner of a fenced PV is told: why, what is at its path and where its own disk
    /// is when this node shows it (`facts`), and what to do.
    fn fence_note(&self, pv: &PvState, reason: FenceReason, facts: &FenceFacts) -> String {
        let key = fence_key(&pv.name).unwrap_or_default();
        let mut note = format!(
            "no pod may newly mount PV {} at {} on node {}: {}. kubelet and the scheduler refuse it by its node \
             affinity (node label {key}={}); pods already running keep their mount.",
            pv.name,
            pv.host_path,
            self.identity.node,
            reason.describe(),
            reason.label_value()
        );
        if let Some(other) = &facts.disk_there_of {
            note.push_str(&format!(" The disk there is the disk of PV {other}."));
        }
        if let Some(to) = &facts.own_disk_at {
            note.push_str(&format!(" Its own disk is at {to} on this node now."));
        }
        note.push_str(
            " Put each disk back at its own path (`local-static-provisioner disks` on the node and the PV's \
             volume-identity annotation tell which is whose; mount by UUID or by-id so a reboot cannot reorder \
             them): the fence is lifted at once, see docs/troubleshooting.md, \"A volume is fenced\"",
        );
        note
    }

    /// When the agent stops: the node-wide fence, so that no pod newly mounts a volume of this
    /// node until the next agent has checked its disk (a reboot may reorder the disks, or an
    /// operator swap them, while no agent runs). Best effort within a few seconds: an agent that
    /// cannot reach the API cannot fence, and says so.
    pub(super) async fn fence_on_stop(&mut self) {
        match self.fence_node_wide().await {
            Ok(true) => info!("node-wide volume fence set until the next agent has checked the disks"),
            Ok(false) => {}
            Err(e) => warn!(error = %e, "could not set the node-wide volume fence on stopping"),
        }
    }

    /// When the agent starts, before its first pass: the node-wide fence, unless the Node
    /// carries it already (the agent before stopped cleanly, or kubelet's start set it). An
    /// agent killed without SIGTERM (OOM, SIGKILL, a crash) set none, and the disks may have
    /// been swapped since: without it, a pod starting now would mount whatever its path holds
    /// until the first pass has checked it. The first pass lifts it (core::fence::volume_fence::plan_fences),
    /// so it costs the pods that mount this node's volumes the time of that pass, which they
    /// wait after a clean restart anyway. Best effort: the first pass follows either way.
    pub(super) async fn fence_at_start(&mut self) {
        let labels = self.node.metadata.labels.as_ref();
        if labels.is_some_and(|l| l.contains_key(crate::core::fence::volume_fence::LABEL_VOLUMES_UNVERIFIED)) {
            return info!("the node-wide volume fence is up; the first pass lifts it once it has checked every disk");
        }
        match self.fence_node_wide().await {
            Ok(true) => info!("node-wide volume fence set until the first pass has checked every disk"),
            Ok(false) => {}
            Err(e) => warn!(error = %e, "could not set the node-wide volume fence on starting; the first pass follows"),
        }
    }

    /// Sets the node-wide fence when any PV of this node honours it (false when none does),
    /// within a few seconds; the Node as the write returned it is the one the next plan reads.
    async fn fence_node_wide(&mut self) -> Result<bool, String> {
        // The store holds this node's PVs only (its watch is scoped by our node label).
        let inputs: Vec<FenceInput> = self
            .pv_store
            .state()
            .iter()
            .map(|pv| FenceInput {
                name: pv.metadata.name.clone().unwrap_or_default(),
                honours: pv.fence_honoured,
                seen: Seen::NoAnswer,
            })
            .collect();
        let Some((key, value)) = stop_label(&inputs) else { return Ok(false) };
        let labels = BTreeMap::from([(key, Some(value))]);
        let patched = self.cluster.patch_node_labels(&self.identity.node, &labels);
        match tokio::time::timeout(NODE_WIDE_DEADLINE, patched).await {
            Ok(Ok(node)) => {
                self.node = node;
                Ok(true)
            }
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("the API did not answer in time".into()),
        }
    }
}

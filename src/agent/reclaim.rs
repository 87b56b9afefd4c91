//! Reclaim (core::wipe::cleanup): released PVs are wiped and deleted, cleanup requests answered,
//! PVs made by upstream or an older version get our finalizer, and identities recorded in an
//! old format are re-recorded once the disk proves to be the same.

use std::collections::{BTreeMap, BTreeSet};

use tracing::info;

use super::Agent;
use crate::api::AnnotationPatch;
use crate::core::identity::disk_trust::missing_disk_label;
use crate::core::reconcile::effect_key::EffectKey;
use crate::core::volumes::naming::{ANN_CLEANUP_RESULT, ANN_VOLUME_IDENTITY, FINALIZER_WIPE, LABEL_DISK_ID};
use crate::core::volumes::volume_safety::{DiskKey, PublishedDisk, wipe_would_hit_another_pv};
use crate::core::wipe::cleanup::{CleanupAction, PvState, plan_cleanup};
use crate::wiper::target_for;

/// For each PV about to be wiped (by UID), why its disk must not be wiped because another live
/// PV of this node names the same disk (two PVs of one disk made before the one-disk rule, or by
/// upstream). `disks` are the disks the observation found for this node's PVs.
pub(super) fn disks_shared_with_live_pvs(
    states: &[PvState],
    wipes: &BTreeSet<String>,
    disks: &[(String, DiskKey)],
) -> BTreeMap<String, String> {
    let located: Vec<(&PvState, &DiskKey)> =
        disks.iter().filter_map(|(uid, disk)| Some((states.iter().find(|s| &s.uid == uid)?, disk))).collect();
    let others: Vec<PublishedDisk> = located
        .iter()
        .map(|(pv, disk)| PublishedDisk {
            name: pv.name.clone(),
            phase: pv.phase.clone(),
            deleting: pv.deleting,
            disk: (*disk).clone(),
        })
        .collect();
    located
        .iter()
        .filter(|(pv, _)| wipes.contains(&pv.uid))
        .filter_map(|(pv, disk)| Some((pv.uid.clone(), wipe_would_hit_another_pv(&pv.name, disk, &others)?)))
        .collect()
}

impl Agent {
    /// Plans and starts cleanup for this node's PVs. Volumes that are missing are not wiped
    /// until they are back.
    pub(super) async fn clean(
        &mut self,
        states: &[PvState],
        missing: &BTreeSet<String>,
        disks: Option<Vec<(String, DiskKey)>>,
    ) {
        let busy = self.cleaner.busy(states);
        let actions = plan_cleanup(states, &busy.pvs);
        let wipes: BTreeSet<String> = actions
            .iter()
            .filter_map(|a| if let CleanupAction::Wipe { pv, .. } = a { Some(pv.uid.clone()) } else { None })
            .collect();
        // Fails closed: a wipe starts only in a pass that read the disks of all this node's
        // PVs (one became due after the observation: it starts in the next pass, at once).
        let shared = match &disks {
            _ if wipes.is_empty() => BTreeMap::new(),
            Some(disks) => disks_shared_with_live_pvs(states, &wipes, disks),
            None => {
                self.settles.next_settle = Some(std::time::Instant::now());
                let why = "its disk was not compared with the disks of this node's other PVs in this pass";
                wipes.iter().map(|uid| (uid.clone(), why.to_string())).collect()
            }
        };
        for action in actions {
            match action {
                CleanupAction::AddFinalizer { name } => {
                    let key = EffectKey::Finalizer(name.clone());
                    let pvs = self.pv_store.state();
                    let Some(pv) = pvs.iter().find(|pv| pv.metadata.name.as_deref() == Some(name.as_str())) else {
                        continue;
                    };
                    if !self.effects.due(&key) {
                        continue;
                    }
                    let result = self.take_over(pv).await;
                    self.effects.record(&key, &result);
                    if result.is_ok() {
                        info!(pv = %name, "added our wipe finalizer");
                    }
                }
                CleanupAction::Wipe { pv, .. } if missing.contains(&pv.uid) => {
                    let note = format!("volume of PV {} is missing; it will be wiped when it is back", pv.name);
                    self.report_pv_problem(&pv.name, "VolumeMissing", note).await;
                }
                CleanupAction::Wipe { .. } if disks.is_none() => {}
                CleanupAction::Wipe { pv, .. } if shared.contains_key(&pv.uid) => {
                    let note = format!("refusing to wipe PV {}: {}", pv.name, shared[&pv.uid]);
                    self.report_pv_problem(&pv.name, "VolumeFailedDelete", note).await;
                }
                CleanupAction::Wipe { pv, after } => {
                    match target_for(&pv, self.config.storage_class_map.get(&pv.class)) {
                        Ok(target) => {
                            info!(pv = %pv.name, path = %target.path.display(), ?after, "starting wipe");
                            self.cleaner.start(pv, after, target);
                        }
                        Err(msg) => {
                            let note = match self.config_state.left_out_classes.get(&pv.class) {
                                Some(problems) => format!(
                                    "not wiping PV {}: its class {:?} is invalid in the ConfigMap ({problems}); \
                                     the volume is kept as it is until the class is fixed",
                                    pv.name, pv.class
                                ),
                                None => format!("cannot clean PV {}: {msg}", pv.name),
                            };
                            self.report_pv_problem(&pv.name, "VolumeFailedDelete", note).await;
                        }
                    }
                }
                CleanupAction::Withdraw { name, resource_version } => {
                    let Some(uid) = states.iter().find(|s| s.name == name).map(|s| s.uid.clone()) else { continue };
                    let deleted = self.cluster.delete_pv(&name, &uid, Some(&resource_version));
                    if let Some(Ok(())) = self.effects.run(&EffectKey::Withdraw(name.clone()), deleted).await {
                        info!(pv = %name, "withdrew Available PV for the requested cleanup");
                    }
                }
                CleanupAction::ReleaseFinalizer { name, uid } => {
                    let released = self.cluster.remove_finalizer(&name, &uid, FINALIZER_WIPE);
                    if let Some(Ok(())) = self.effects.run(&EffectKey::Release(name.clone()), released).await {
                        self.note_withdrawn(&uid).await;
                        info!(pv = %name, "PV deleted before any claim used it; nothing to wipe")
                    }
                }
                CleanupAction::Refuse { name, refusal } => {
                    if refusal.answers_request() {
                        let patch = AnnotationPatch::new().set(ANN_CLEANUP_RESULT, refusal.to_string());
                        let patched = self.cluster.patch_annotations(&name, None, &patch);
                        self.effects.run(&EffectKey::Answer(name.clone()), patched).await;
                    }
                    self.report_pv_problem(&name, refusal.reason(), refusal.to_string()).await;
                }
            }
        }
    }

    /// Re-records, in the current format, the identities that older versions recorded, once the
    /// old record proves the disk there is the same one (the observation's `upgrades`, by UID):
    /// later swaps (a clone with the same filesystem UUID, another XFS on the same device) are
    /// then caught by the stronger identity. Guarded by the resourceVersion, so a concurrent
    /// change is never overwritten.
    pub(super) async fn upgrade_identities(&mut self, states: &[PvState], upgrades: &[(String, String)]) {
        for (uid, identity) in upgrades {
            let Some(pv) = states.iter().find(|s| &s.uid == uid) else { continue };
            let patch = AnnotationPatch::new().set(ANN_VOLUME_IDENTITY, identity.clone());
            let patched = self.cluster.patch_annotations(&pv.name, Some(&pv.resource_version), &patch);
            if let Some(Ok(())) = self.effects.run(&EffectKey::Upgrade(pv.name.clone()), patched).await {
                info!(pv = %pv.name, %identity, "volume identity re-recorded in the current format");
            }
        }
    }

    /// Puts the disk-id label (core::identity::disk_trust) on this node's PVs that lack it: PVs made
    /// before the label existed (by an older version, or adopted from upstream) are then found
    /// by another node about to offer their disk, as new ones are. One patch per PV, guarded
    /// by its resourceVersion; not again while the store has not shown it yet. PVs whose
    /// identity is re-recorded this pass are labelled at the next, from the new record.
    pub(super) async fn label_disks(&mut self, upgrades: &[(String, String)]) {
        let pvs = self.pv_store.state();
        let live: BTreeSet<&str> = pvs.iter().filter_map(|pv| pv.metadata.uid.as_deref()).collect();
        self.marks.disk_labelled.retain(|uid, _| live.contains(uid.as_str()));
        for pv in &pvs {
            let (Some(name), Some(uid)) = (pv.metadata.name.as_deref(), pv.metadata.uid.as_deref()) else { continue };
            let rv = pv.metadata.resource_version.clone().unwrap_or_default();
            if pv.metadata.deletion_timestamp.is_some()
                || upgrades.iter().any(|(u, _)| u == uid)
                || self.marks.disk_labelled.get(uid) == Some(&rv)
            {
                continue;
            }
            let identity = pv.annotation(ANN_VOLUME_IDENTITY).map(String::as_str);
            let Some(label) = missing_disk_label(identity, pv.label(LABEL_DISK_ID).map(String::as_str)) else {
                continue;
            };
            let labels = BTreeMap::from([(LABEL_DISK_ID.to_string(), label)]);
            let patched = self.cluster.set_pv_labels(name, Some(&rv), &labels);
            if let Some(Ok(())) = self.effects.run(&EffectKey::Upgrade(name.to_string()), patched).await {
                info!(pv = %name, "disk-id label put on a PV made before it existed");
                self.marks.disk_labelled.insert(uid.to_string(), rv);
            }
        }
    }
}

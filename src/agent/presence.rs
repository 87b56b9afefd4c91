//! Presence: a PV whose volume vanished is withdrawn while unbound and flagged while bound;
//! the flag goes when the volume is back (core::volumes::presence).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use tracing::{info, warn};

use super::Agent;
use crate::api::{AnnotationPatch, pv_reference};
use crate::core::devices::device_claim::{Tampered, tamper_withdrawals};
use crate::core::reconcile::effect_key::EffectKey;
use crate::core::volumes::naming::{ANN_VOLUME_MISSING, ANN_VOLUME_MOVED_TO};
use crate::core::volumes::presence::{PresenceAction, plan_presence, where_moved};
use crate::core::wipe::cleanup::PvState;

impl Agent {
    /// UIDs of this node's PVs whose volume has been gone for the settle window (from the
    /// observation's `absent`), and when the next one would be.
    pub(super) fn missing_volumes(&mut self, absent: &[String]) -> (BTreeSet<String>, Option<Instant>) {
        self.settles.vanished.observe(absent.iter().cloned(), Instant::now(), self.settles.settle)
    }

    /// Withdraws unbound PVs whose volume vanished, flags bound ones, unflags returned ones.
    /// Returns the UIDs of the PVs withdrawn.
    pub(super) async fn follow_presence(&mut self, states: &[PvState], missing: &BTreeSet<String>) -> BTreeSet<String> {
        let mut withdrawn = BTreeSet::new();
        let moved: BTreeMap<String, String> = states
            .iter()
            .filter(|pv| missing.contains(&pv.uid))
            .filter_map(|pv| Some((pv.uid.clone(), where_moved(pv, &self.marks.found_disks)?)))
            .collect();
        for action in plan_presence(states, missing, &moved) {
            match action {
                PresenceAction::Withdraw { name, uid, resource_version } => {
                    let key = EffectKey::Withdraw(name.clone());
                    let deleted = self.cluster.delete_pv(&name, &uid, Some(&resource_version));
                    if let Some(Ok(())) = self.effects.run(&key, deleted).await {
                        self.note_withdrawn(&uid).await;
                        withdrawn.insert(uid.clone());
                        info!(pv = %name, "volume vanished; unbound PV withdrawn");
                        let note = format!("volume of PV {name} is gone from the node; the unbound PV is withdrawn");
                        self.cluster
                            .event(&pv_reference(&name, Some(&uid)), false, "VolumeWithdrawn", "Discover", note)
                            .await;
                    }
                }
                PresenceAction::Flag { name, moved_to } => {
                    let now = k8s_openapi::jiff::Timestamp::now().to_string();
                    let patch = AnnotationPatch::new()
                        .set(ANN_VOLUME_MISSING, now)
                        .set_or_remove(ANN_VOLUME_MOVED_TO, moved_to.clone());
                    let key = EffectKey::FlagMissing(name.clone());
                    let patched = self.cluster.patch_annotations(&name, None, &patch);
                    if let Some(Ok(())) = self.effects.run(&key, patched).await {
                        let note = match &moved_to {
                            Some(to) => format!(
                                "the volume of PV {name} is not at its path: its disk is at {to} on this node \
                                 now. The PV is kept and the disk is not published there; put it back (or \
                                 delete the claim when its data is not needed)"
                            ),
                            None => format!("the volume of PV {name} is missing from the node; the PV is kept"),
                        };
                        warn!(pv = %name, "{note}");
                        self.cluster.event(&self.pv_ref(&name), true, "VolumeMissing", "Discover", note).await;
                    }
                }
                PresenceAction::Unflag { name } => {
                    let patch = AnnotationPatch::new().remove(ANN_VOLUME_MISSING).remove(ANN_VOLUME_MOVED_TO);
                    let key = EffectKey::Unflag(name.clone());
                    let patched = self.cluster.patch_annotations(&name, None, &patch);
                    if let Some(Ok(())) = self.effects.run(&key, patched).await {
                        info!(pv = %name, "volume is back");
                        let note = format!("the volume of PV {name} is back");
                        self.cluster.event(&self.pv_ref(&name), false, "VolumeBack", "Discover", note).await;
                    }
                }
            }
        }
        withdrawn
    }

    /// Withdraws the unbound PVs whose claimed device changed under them (resourceVersion
    /// precondition: one bound meanwhile is left alone), then holds their claim records
    /// durably; a Warning event on the PV says what was found. A bound or released PV is never
    /// touched here (core::devices::device_claim only reports unbound ones, and the store is checked
    /// again).
    pub(super) async fn withdraw_tampered(&mut self, states: &[PvState], tampered: &[Tampered]) {
        for (name, uid, resource_version, t) in tamper_withdrawals(states, tampered) {
            let key = EffectKey::WithdrawTampered(name.clone());
            let deleted = self.cluster.delete_pv(&name, &uid, Some(&resource_version));
            if let Some(Ok(())) = self.effects.run(&key, deleted).await {
                self.note_withdrawn(&uid).await;
                let (path, why) = (t.host_path.clone(), t.why.clone());
                if let Some(Err(e)) = self.on_host(move |host| host.hold_claim(&path, &why)).await {
                    warn!(pv = %name, error = %e, "cannot record the hold of the device; it is held while the finding lasts");
                }
                self.metrics.claim_withdrawn(&t.class);
                let note = format!(
                    "the claimed device of unbound PV {name} (link {} of class {}) changed under it: {}. The PV is withdrawn and the device held until it proves blank and unused again (clear it with `local-static-provisioner wipe-disk` on the node, or remove the link)",
                    t.name, t.class, t.why
                );
                warn!(pv = %name, "{note}");
                self.cluster.event(&pv_reference(&name, Some(&uid)), true, "ClaimedDeviceChanged", "Claim", note).await;
            }
        }
    }
}

//! Succession (core::cluster::succession): PVs an earlier incarnation of this Node left are re-adopted
//! when their disk is here, and withdrawn or flagged once it has stayed missing or different
//! for the succession settle window.

use std::path::PathBuf;
use std::time::Instant;

use tracing::{info, warn};

use super::Agent;
use crate::api::{AnnotationPatch, pv_reference};
use crate::core::cluster::succession::{DiskCheck, SuccessionAction, plan_succession};
use crate::core::reconcile::effect_key::EffectKey;
use crate::core::volumes::naming::{
    ANN_PROVISIONED_BY, ANN_VOLUME_IDENTITY, ANN_VOLUME_MOVED_TO, ANN_VOLUME_STALE, FINALIZER_WIPE,
};
use crate::core::volumes::presence::where_moved;
use crate::core::wipe::cleanup::PvState;
use crate::wiper::target_for;

/// Checks whose outcome must hold for the settle window before it is acted on.
fn doubtful(check: DiskCheck) -> bool {
    matches!(check, DiskCheck::Different | DiskCheck::Missing | DiskCheck::Unverified | DiskCheck::Moved)
}

impl Agent {
    /// Decides about the predecessor PVs from the observation's disk checks (by UID). Returns
    /// when the next undecided one settles.
    pub(super) async fn succeed(&mut self, pvs: &[PvState], checks: &[(String, DiskCheck)]) -> Option<Instant> {
        let mut found: Vec<(PvState, PathBuf, DiskCheck)> = Vec::new();
        for pv in pvs {
            match target_for(pv, self.config.storage_class_map.get(&pv.class)) {
                Ok(target) => {
                    let Some((_, check)) = checks.iter().find(|(uid, _)| *uid == pv.uid) else { continue };
                    // A disk that is not at its path but at another entry of this node moved (or
                    // was swapped with another): its data is on this live node, so it is never
                    // taken for gone.
                    let check = match check {
                        DiskCheck::Different | DiskCheck::Missing
                            if where_moved(pv, &self.marks.found_disks).is_some() =>
                        {
                            DiskCheck::Moved
                        }
                        check => *check,
                    };
                    found.push((pv.clone(), target.path, check));
                }
                Err(msg) => {
                    let note = format!(
                        "PV {} was made for an earlier incarnation of this node and is left alone: {msg}",
                        pv.name
                    );
                    self.report_pv_problem(&pv.name, "VolumeStale", note).await;
                }
            }
        }
        let key = |pv: &PvState, check: DiskCheck| format!("{}\n{check:?}", pv.uid);
        let doubts = found.iter().filter(|(_, _, c)| doubtful(*c)).map(|(pv, _, c)| key(pv, *c));
        let (settled, next) = self.settles.stale.observe(doubts, Instant::now(), self.settles.succession_settle);
        for (pv, path, check) in found {
            if doubtful(check) && !settled.contains(&key(&pv, check)) {
                continue;
            }
            let Some(action) = plan_succession(&pv, check) else { continue };
            self.execute_succession(action, &pv, path, check).await;
        }
        next
    }

    async fn execute_succession(&mut self, action: SuccessionAction, pv: &PvState, path: PathBuf, check: DiskCheck) {
        let node = self.identity.node.clone();
        let rv = Some(pv.resource_version.as_str());
        match action {
            SuccessionAction::Readopt { name, resource_version, record_identity, unflag } => {
                let key = EffectKey::Readopt(name.clone());
                if !self.effects.due(&key) {
                    return;
                }
                let mut patch = AnnotationPatch::new().set(ANN_PROVISIONED_BY, self.identity.provisioner.clone());
                if unflag {
                    patch = patch.remove(ANN_VOLUME_STALE);
                }
                if pv.moved_to.is_some() {
                    // The disk is back at its path: it has not moved any more.
                    patch = patch.remove(ANN_VOLUME_MOVED_TO);
                }
                if record_identity {
                    match self.volume_identity(&pv.host_path, path.clone()).await {
                        Ok(id) => patch = patch.set(ANN_VOLUME_IDENTITY, id),
                        Err(e) => {
                            let e = format!("cannot read the disk identity: {e}");
                            return self.effects.record::<(), _>(&key, &Err(e));
                        }
                    }
                }
                let result = self.cluster.patch_annotations(&name, Some(&resource_version), &patch).await;
                self.effects.record(&key, &result);
                if result.is_ok() {
                    let note = format!(
                        "PV re-adopted by the agent of re-created node {node} ({}): {}",
                        self.node_info.uid,
                        check.describe()
                    );
                    info!(pv = %name, path = %path.display(), "{note}");
                    self.cluster.event(&self.pv_ref(&name), false, "VolumeReadopted", "Adopt", note).await;
                    self.metrics.succession("readopted");
                }
            }
            SuccessionAction::Withdraw { name, uid, resource_version } => {
                let deleted = self.cluster.delete_pv(&name, &uid, Some(&resource_version));
                if let Some(Ok(())) = self.effects.run(&EffectKey::Withdraw(name.clone()), deleted).await {
                    self.note_withdrawn(&uid).await;
                    let note =
                        format!("unbound PV of an earlier incarnation of node {node} withdrawn: {}", check.describe());
                    info!(pv = %name, "{note}");
                    self.cluster.event(&pv_reference(&name, Some(&uid)), false, "VolumeWithdrawn", "Adopt", note).await;
                    self.metrics.succession("withdrawn");
                }
            }
            SuccessionAction::ReleaseFinalizer { name, uid } => {
                let released = self.cluster.remove_finalizer(&name, &uid, FINALIZER_WIPE);
                if let Some(Ok(())) = self.effects.run(&EffectKey::Release(name.clone()), released).await {
                    self.note_withdrawn(&uid).await;
                    info!(pv = %name, "stale PV never used by a claim; our finalizer released")
                }
            }
            SuccessionAction::Report { name } => {
                let note = format!(
                    "PV of an earlier incarnation of node {node} is not re-adopted: {}. If it is the same disk, \
                     remove the annotation {ANN_VOLUME_IDENTITY} from the PV and the agent re-adopts it, recording \
                     the disk anew; if not, delete its claim when the data is not needed",
                    check.describe()
                );
                self.report_pv_problem(&name, "VolumeUnverified", note).await;
                self.metrics.succession("unverified");
            }
            SuccessionAction::FlagMoved { name } => {
                let Some(to) = where_moved(pv, &self.marks.found_disks) else { return };
                let patch = AnnotationPatch::new().set(ANN_VOLUME_MOVED_TO, to.clone()).remove(ANN_VOLUME_STALE);
                let patched = self.cluster.patch_annotations(&name, rv, &patch);
                if let Some(Ok(())) = self.effects.run(&EffectKey::FlagMoved(name.clone()), patched).await {
                    let note = format!(
                        "PV of an earlier incarnation of node {node} is not re-adopted: its disk is at {to} on \
                         this node now, not at its path. A claim uses or used it, so it is kept and never \
                         released by node-cleanup, and the disk is not published at {to}. Put the disk back \
                         at its path to have it re-adopted"
                    );
                    warn!(pv = %name, "{note}");
                    self.cluster.event(&self.pv_ref(&name), true, "VolumeMoved", "Adopt", note).await;
                    self.metrics.succession("flagged_moved");
                }
            }
            SuccessionAction::Flag { name, check } => {
                let now = k8s_openapi::jiff::Timestamp::now().to_string();
                let patch = AnnotationPatch::new().set(ANN_VOLUME_STALE, now).remove(ANN_VOLUME_MOVED_TO);
                let patched = self.cluster.patch_annotations(&name, rv, &patch);
                if let Some(Ok(())) = self.effects.run(&EffectKey::FlagStale(name.clone()), patched).await {
                    let note = format!(
                        "PV of an earlier incarnation of node {node} is stale: {}; a claim uses or used it, so it \
                         is kept. Where node-cleanup is enabled for class {}, it releases the claim after its \
                         grace period; otherwise delete the claim when its data is not needed",
                        check.describe(),
                        pv.class
                    );
                    warn!(pv = %name, "{note}");
                    self.cluster.event(&self.pv_ref(&name), true, "VolumeStale", "Adopt", note).await;
                    self.metrics.succession("flagged_stale");
                }
            }
        }
    }
}

//! One observation of the host per pass: the scan of the discovery directories, the presence
//! and disks of this node's PVs and the disk checks of an earlier incarnation's PVs, all read
//! in one blocking call against one mount table.

use std::collections::BTreeSet;

use tracing::error;

use super::Agent;
use crate::core::reconcile::effect_key::EffectKey;
use crate::core::wipe::cleanup::{CleanupAction, PvState, plan_cleanup};
use crate::host::access::{Ask, Observation};
use crate::wiper::target_for;

impl Agent {
    /// Observes the host for this pass. `None` when it cannot be read (the mount table): the
    /// pass stops there, and the failure is retried with backoff, its deadline waking the loop.
    pub(super) async fn observe(&mut self, states: &[PvState], predecessors: &[PvState]) -> Option<Observation> {
        let located = |pvs: &[PvState]| {
            pvs.iter()
                .filter_map(|pv| {
                    let target = target_for(pv, self.config.storage_class_map.get(&pv.class)).ok()?;
                    Some((pv.clone(), target.path))
                })
                .collect::<Vec<_>>()
        };
        // The disks of all this node's PVs are read only when a wipe may start in this pass.
        let busy = self.cleaner.busy(states);
        let disks = plan_cleanup(states, &busy.pvs).iter().any(|a| matches!(a, CleanupAction::Wipe { .. }));
        let ask = Ask {
            config: self.config.clone(),
            published: states.iter().map(|pv| pv.host_path.clone()).collect::<BTreeSet<_>>(),
            pvs: located(states),
            disks,
            predecessors: located(predecessors),
            pv_identities: states
                .iter()
                .chain(predecessors)
                .map(|pv| (pv.host_path.clone(), pv.identity.clone()))
                .collect(),
            unbound: states
                .iter()
                .filter(|pv| !pv.deleting && !pv.claimed && matches!(pv.phase.as_str(), "Available" | "Pending"))
                .map(|pv| pv.host_path.clone())
                .collect(),
        };
        let observed = self.on_host(move |host| host.observe(ask)).await;
        let observed = observed.map(|r| r.map_err(|e| e.to_string())).unwrap_or_else(|| Err("host task failed".into()));
        self.effects.record(&EffectKey::Observe, &observed);
        match observed {
            Ok(observation) => Some(observation),
            Err(e) => {
                error!(error = %e, "discovery failed; retrying");
                None
            }
        }
    }
}

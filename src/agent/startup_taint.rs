//! Upstream's `removeNodeNotReadyTaint` (core::fence::startup_taint): after the first pass that left
//! nothing of this node's volumes to publish, the start-up taint
//! `provisionerNotReadyNodeTaintKey` is removed from this node's Node, once per start.

use tracing::{info, warn};

use super::Agent;
use crate::api::node_reference;
use crate::core::fence::startup_taint::{PassOutcome, TaintStep, step};
use crate::core::reconcile::effect_key::EffectKey;

impl Agent {
    /// The configured start-up taint key while `removeNodeNotReadyTaint` is on.
    fn startup_taint_key(&self) -> Option<&str> {
        (self.config.remove_node_not_ready_taint).then_some(self.config.provisioner_not_ready_node_taint_key.as_str())
    }

    /// Removes the start-up taint when this pass (`outcome`) published everything. A failed
    /// write is tried again with backoff on later passes; the Node's taints are read from the
    /// watch of it each pass, and the write fails rather than undo a change made meanwhile.
    pub(super) async fn follow_startup_taint(&mut self, outcome: PassOutcome) {
        let key = match self.startup_taint_key() {
            Some("") if !self.startup_taint_done => {
                // Upstream's binary has no default key either: say once why nothing happens.
                self.startup_taint_done = true;
                warn!(
                    "removeNodeNotReadyTaint is true but provisionerNotReadyNodeTaintKey is empty: no taint is removed"
                );
                return;
            }
            other => other.map(str::to_string),
        };
        let taints = self.node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
        match step(key.as_deref(), self.startup_taint_done, &outcome, &taints) {
            TaintStep::Wait => {}
            TaintStep::Absent => {
                self.startup_taint_done = true;
                info!(
                    taint = key.as_deref().unwrap_or_default(),
                    "the start-up taint is not on this Node; nothing to remove"
                );
            }
            TaintStep::Remove { expected, remaining } => {
                let key = key.unwrap_or_default();
                let patched = self.cluster.replace_node_taints(&self.identity.node, &expected, &remaining);
                match self.effects.run(&EffectKey::StartupTaint, patched).await {
                    Some(Ok(node)) => {
                        self.node = node;
                        self.startup_taint_done = true;
                        let note = format!("this node's volumes are published: removed the start-up taint {key}");
                        info!(taint = %key, "{note}");
                        self.cluster
                            .event(&node_reference(&self.node), false, "StartupTaintRemoved", "Discover", note)
                            .await;
                    }
                    Some(Err(e)) => {
                        warn!(taint = %key, error = %e, "could not remove the start-up taint; tried again on a later pass")
                    }
                    None => {}
                }
            }
        }
    }
}

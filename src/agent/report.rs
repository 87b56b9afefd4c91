//! Problems reported once per occurrence (core::occurrence): logged and evented when a pass
//! first sees them, forgotten when a pass no longer does, so one that comes back is reported
//! again and memory holds only the problems of now.

use tracing::{info, warn};

use super::Agent;
use crate::api::{class_reference, node_reference, pv_reference};
use crate::core::naming::pv_name;
use crate::discovery::Scan;

impl Agent {
    /// Logs each skipped entry once per occurrence; skips that protect data (symlinks, mounts
    /// of the host itself, unsafe or shared discovery directories) are also Warning events.
    pub(super) async fn report_skips(&mut self, scan: &Scan) {
        for s in &scan.skipped {
            let key = format!("skip/{}/{}/{}", s.class, s.path.display(), s.reason);
            if !self.problems.first_seen(key) {
                continue;
            }
            if s.reason.is_safety_refusal() {
                warn!(class = %s.class, path = %s.path.display(), reason = s.reason.code(), "entry refused: {}", s.reason);
                let note = format!("{} (class {}) not published: {}", s.path.display(), s.class, s.reason);
                // The PV the entry would have become (or the class, for a refused directory)
                // keeps each refusal its own Event.
                let related = match s.path.file_name().and_then(|n| n.to_str()) {
                    Some(entry) if !s.reason.is_class_wide() => {
                        self.pv_ref(&pv_name(entry, &self.identity.node, &s.class))
                    }
                    _ => class_reference(&s.class),
                };
                self.node_event(Some(related), "VolumeNotPublished", "Discover", note).await;
            } else {
                info!(class = %s.class, path = %s.path.display(), reason = s.reason.code(), "entry skipped: {}", s.reason);
            }
        }
    }

    /// A volume not published as PV `pv`, once per occurrence of `key`: a Warning event on
    /// the Node, related to the PV it would have been. Returns whether it was new (the caller
    /// logs it then, unless a failed effect's own log already said it).
    pub(super) async fn report_unpublished(&mut self, key: String, pv: &str, note: String) -> bool {
        let new = self.problems.first_seen(key);
        if new {
            let note: String = note.chars().take(1000).collect();
            self.node_event(Some(self.pv_ref(pv)), "VolumeNotPublished", "Publish", note).await;
        }
        new
    }

    /// A problem of PV `name`, once per occurrence: Warning event on the PV.
    pub(super) async fn report_pv_problem(&mut self, name: &str, reason: &str, note: String) {
        if self.problems.first_seen(format!("pv/{name}/{reason}/{note}")) {
            warn!(pv = name, "{note}");
            self.cluster.event(&self.pv_ref(name), true, reason, "Clean", note).await;
        }
    }

    /// A problem of this node's agent, once per occurrence: Warning event on the Node.
    pub(super) async fn report_node_problem(&mut self, reason: &str, note: String) {
        if self.problems.first_seen(format!("node/{reason}/{note}")) {
            warn!("{note}");
            self.cluster.event(&node_reference(&self.node), true, reason, "Discover", note).await;
        }
    }

    /// The reference of PV `name` for an Event, with the UID of the PV the store holds under
    /// that name (none when it does not exist: an entry not published).
    pub(super) fn pv_ref(&self, name: &str) -> k8s_openapi::api::core::v1::ObjectReference {
        let pv = self.pv_store.get(&kube::runtime::reflector::ObjectRef::new(name));
        pv_reference(name, pv.as_ref().and_then(|pv| pv.metadata.uid.as_deref()))
    }

    /// A Warning event on this Node, related to `related`.
    pub(super) async fn node_event(
        &self,
        related: Option<k8s_openapi::api::core::v1::ObjectReference>,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.cluster.event_related(&node_reference(&self.node), related, true, reason, action, note).await;
    }
}

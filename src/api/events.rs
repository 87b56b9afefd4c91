//! Events: what an operator sees in `kubectl describe`, the references they are about, and the
//! one cut of a note at the API's limit.

use k8s_openapi::api::core::v1::{Node, ObjectReference, PersistentVolume, PersistentVolumeClaim};
use kube::Resource;

use super::recorder::Said;

use super::*;

/// An object reference for Events about a PV. With the PV's UID whenever it is known:
/// `kubectl describe pv` lists only the events whose reference carries the PV's UID, so
/// without it an operator sees none of them there. `None` only for a PV that does not exist
/// (an entry that was not published under that name).
pub fn pv_reference(name: &str, uid: Option<&str>) -> ObjectReference {
    ObjectReference {
        api_version: Some(PersistentVolume::api_version(&()).into()),
        kind: Some(PersistentVolume::kind(&()).into()),
        name: Some(name.to_string()),
        uid: uid.filter(|u| !u.is_empty()).map(str::to_string),
        ..Default::default()
    }
}

/// An object reference for Events about a StorageClass (a class whose directory is refused).
pub fn class_reference(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some(StorageClass::api_version(&()).into()),
        kind: Some(StorageClass::kind(&()).into()),
        name: Some(name.to_string()),
        ..Default::default()
    }
}

/// An object reference for Events about a claim (node-cleanup deletes claims).
pub fn claim_reference(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some(PersistentVolumeClaim::api_version(&()).into()),
        kind: Some(PersistentVolumeClaim::kind(&()).into()),
        namespace: Some(namespace.to_string()),
        name: Some(name.to_string()),
        uid: Some(uid.to_string()),
        ..Default::default()
    }
}

/// An object reference for Events about the Node (problems not tied to one PV).
pub fn node_reference(node: &Node) -> ObjectReference {
    ObjectReference {
        api_version: Some(Node::api_version(&()).into()),
        kind: Some(Node::kind(&()).into()),
        name: node.metadata.name.clone(),
        uid: node.metadata.uid.clone(),
        ..Default::default()
    }
}

/// Longest Event note the API accepts (events.k8s.io/v1 validation, `NoteLengthLimit`): a
/// longer one is refused, and the event lost.
pub const EVENT_NOTE_MAX: usize = 1024;

/// What ends a note that was cut, so a reader knows there was more.
pub const EVENT_NOTE_CUT: &str = " [...]";

/// `note` cut once, at [`EVENT_NOTE_MAX`] bytes, ending with [`EVENT_NOTE_CUT`] at a character
/// boundary: every event goes through here (and nowhere else cuts), so a long path or a list of
/// signatures never costs the event itself, and a cut note always says it was cut.
pub fn event_note(mut note: String) -> String {
    if note.len() > EVENT_NOTE_MAX {
        let mut end = EVENT_NOTE_MAX - EVENT_NOTE_CUT.len();
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push_str(EVENT_NOTE_CUT);
    }
    note
}

impl Cluster {
    /// Publishes an Event an operator should see (`kubectl describe`), logging instead of
    /// failing when events cannot be written.
    pub async fn event(&self, regarding: &ObjectReference, warning: bool, reason: &str, action: &str, note: String) {
        self.event_related(regarding, None, warning, reason, action, note).await;
    }

    /// As `event`, returning the failure, so a fenced caller learns that it lost leadership.
    pub async fn try_event(
        &self,
        regarding: &ObjectReference,
        warning: bool,
        reason: &str,
        action: &str,
        note: String,
    ) -> Result<(), ApiError> {
        self.try_event_related(regarding, None, warning, reason, action, note).await
    }

    /// Publishes an Event that also names a related object. The recorder (api::recorder) folds
    /// only the same Event again (same note too) into a series; a related object, such as the
    /// PV an entry would have become, lets a reader find what the Event is about.
    pub async fn event_related(
        &self,
        regarding: &ObjectReference,
        related: Option<ObjectReference>,
        warning: bool,
        reason: &str,
        action: &str,
        note: String,
    ) {
        if let Err(e) = self.try_event_related(regarding, related, warning, reason, action, note).await {
            tracing::warn!(reason, error = %e, "could not publish event");
        }
    }

    /// As `event_related`, returning the failure. A write like any other: rate limited, and
    /// fenced when the cluster is.
    pub async fn try_event_related(
        &self,
        regarding: &ObjectReference,
        related: Option<ObjectReference>,
        warning: bool,
        reason: &str,
        action: &str,
        note: String,
    ) -> Result<(), ApiError> {
        let ev =
            Said { warning, reason: reason.to_string(), note: event_note(note), action: action.to_string(), related };
        let object = regarding.name.clone().unwrap_or_default();
        self.gated("publish event", &object, self.recorder.publish(&ev, regarding))
            .await?
            .map_err(ApiError::request("publish event", object))
    }
}

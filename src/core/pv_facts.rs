//! A PersistentVolume as the agent and node-cleanup read it from the API: only the fields a
//! decision reads. The full k8s-openapi struct is 3.5 KiB before any string (every volume
//! source of every driver is inline), so a store of a thousand PVs, or node-cleanup's store of
//! every local PV of a large cluster, kept megabytes of empty fields. JSON is decoded straight
//! into this type (unknown fields are skipped by serde), so the full object never exists.
//! Only creating a PV needs the full type (`core::pv`).

use k8s_openapi::api::core::v1::{LocalVolumeSource, ObjectReference, VolumeNodeAffinity};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

/// The fields of a PersistentVolume that any decision of this project reads.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct PvFacts {
    /// Name, UID, resourceVersion, labels, annotations, finalizers, deletion timestamp.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The parts of the spec we read.
    #[serde(default)]
    pub spec: PvFactsSpec,
    /// The parts of the status we read.
    #[serde(default)]
    pub status: PvFactsStatus,
}

/// The parts of `spec` the planners read.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PvFactsSpec {
    /// `spec.local`: only a local PV is ever ours.
    #[serde(default)]
    pub local: Option<LocalVolumeSource>,
    /// `spec.storageClassName`.
    #[serde(default)]
    pub storage_class_name: Option<String>,
    /// `spec.persistentVolumeReclaimPolicy`.
    #[serde(default)]
    pub persistent_volume_reclaim_policy: Option<String>,
    /// `spec.claimRef`: set once a claim was bound.
    #[serde(default)]
    pub claim_ref: Option<ObjectReference>,
    /// `spec.nodeAffinity`: node-cleanup finds the node a PV is pinned to here.
    #[serde(default)]
    pub node_affinity: Option<VolumeNodeAffinity>,
}

/// The parts of `status` the planners read.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct PvFactsStatus {
    /// `status.phase`.
    #[serde(default)]
    pub phase: Option<String>,
}

impl PvFacts {
    /// The host path of a local PV.
    pub fn local_path(&self) -> Option<&str> {
        self.spec.local.as_ref().map(|l| l.path.as_str())
    }

    /// `status.phase`, empty when not set.
    pub fn phase(&self) -> &str {
        self.status.phase.as_deref().unwrap_or_default()
    }

    /// One annotation's value.
    pub fn annotation(&self, key: &str) -> Option<&String> {
        self.metadata.annotations.as_ref()?.get(key)
    }

    /// One label's value.
    pub fn label(&self, key: &str) -> Option<&String> {
        self.metadata.labels.as_ref()?.get(key)
    }
}

/// The API knows this type as a PersistentVolume: kube's `Api`, watcher and store use it
/// through these constants, exactly as for the full type.
impl k8s_openapi::Resource for PvFacts {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "PersistentVolume";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "persistentvolumes";
    type Scope = k8s_openapi::ClusterResourceScope;
}

impl k8s_openapi::ListableResource for PvFacts {
    const LIST_KIND: &'static str = "PersistentVolumeList";
}

impl k8s_openapi::Metadata for PvFacts {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::Resource as _;
    use k8s_openapi::api::core::v1::PersistentVolume;
    use serde_json::json;

    use super::*;

    /// A PV as the API returns it, with fields of every kind we skip.
    fn full() -> serde_json::Value {
        json!({
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {
                "name": "local-pv-1",
                "uid": "u1",
                "resourceVersion": "7",
                "labels": {"local-static-provisioner.io/node": "n1"},
                "annotations": {"pv.kubernetes.io/provisioned-by": "p"},
                "finalizers": ["kubernetes.io/pv-protection"],
                "deletionTimestamp": "2026-11-24T08:00:00Z",
                "managedFields": [{"manager": "kcm", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}]
            },
            "spec": {
                "capacity": {"storage": "10Gi"},
                "local": {"path": "/mnt/disks/a", "fsType": "ext4"},
                "accessModes": ["ReadWriteOnce"],
                "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "ns", "name": "c", "uid": "cu"},
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": "fast",
                "volumeMode": "Filesystem",
                "mountOptions": ["noatime"],
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}}
            },
            "status": {"phase": "Bound", "lastPhaseTransitionTime": "2026-11-24T08:00:00Z"}
        })
    }

    #[test]
    fn reads_what_the_full_type_reads() {
        let facts: PvFacts = serde_json::from_value(full()).unwrap();
        let pv: PersistentVolume = serde_json::from_value(full()).unwrap();
        let spec = pv.spec.as_ref().unwrap();
        assert_eq!(facts.metadata, pv.metadata);
        assert_eq!(facts.spec.local, spec.local);
        assert_eq!(facts.spec.storage_class_name, spec.storage_class_name);
        assert_eq!(facts.spec.persistent_volume_reclaim_policy, spec.persistent_volume_reclaim_policy);
        assert_eq!(facts.spec.claim_ref, spec.claim_ref);
        assert_eq!(facts.spec.node_affinity, spec.node_affinity);
        assert_eq!(facts.status.phase, pv.status.as_ref().unwrap().phase);
        assert_eq!(facts.local_path(), Some("/mnt/disks/a"));
        assert_eq!(facts.phase(), "Bound");
        assert_eq!(facts.annotation("pv.kubernetes.io/provisioned-by").map(String::as_str), Some("p"));
        assert_eq!(facts.label("local-static-provisioner.io/node").map(String::as_str), Some("n1"));
    }

    #[test]
    fn absent_parts_read_as_empty() {
        let facts: PvFacts = serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap();
        assert_eq!(facts.local_path(), None);
        assert_eq!(facts.phase(), "");
        assert_eq!(facts.annotation("a"), None);
        assert_eq!(facts.label("a"), None);
        assert_eq!(facts.spec, PvFactsSpec::default());
        let facts: PvFacts = serde_json::from_value(json!({"metadata": {}, "spec": {}, "status": {}})).unwrap();
        assert_eq!(facts.phase(), "");
    }

    #[test]
    fn is_addressed_as_a_persistent_volume() {
        assert_eq!(PvFacts::KIND, PersistentVolume::KIND);
        assert_eq!(PvFacts::API_VERSION, PersistentVolume::API_VERSION);
        assert_eq!(PvFacts::GROUP, PersistentVolume::GROUP);
        assert_eq!(PvFacts::URL_PATH_SEGMENT, PersistentVolume::URL_PATH_SEGMENT);
        assert_eq!(
            <PvFacts as k8s_openapi::ListableResource>::LIST_KIND,
            <PersistentVolume as k8s_openapi::ListableResource>::LIST_KIND
        );
    }

    #[test]
    fn is_much_smaller_than_the_full_type() {
        assert!(std::mem::size_of::<PvFacts>() * 3 < std::mem::size_of::<PersistentVolume>());
    }
}

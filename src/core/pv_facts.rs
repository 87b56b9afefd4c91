//! A PersistentVolume as the agent and node-cleanup read it from the API: only the fields a
//! decision reads. The full k8s-openapi struct is 3.5 KiB before any string (every volume
//! source of every driver is inline), so a store of a thousand PVs, or node-cleanup's store of
//! every local PV of a large cluster, kept megabytes of empty fields. JSON is decoded straight
//! into this type (unknown fields are skipped by serde), so the full object never exists.
//! Only creating a PV needs the full type (`core::pv`).

use k8s_openapi::api::core::v1::{LocalVolumeSource, ObjectReference, VolumeNodeAffinity};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use super::naming::{ANN_PROVISIONED_BY, LABEL_HOSTNAME};

/// The fields of a PersistentVolume that any decision of this project reads.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(from = "RawPvFacts")]
pub struct PvFacts {
    /// Name, UID, resourceVersion, finalizers, deletion timestamp; labels and annotations are
    /// moved out (below).
    pub metadata: ObjectMeta,
    /// The parts of the spec we read.
    pub spec: PvFactsSpec,
    /// The parts of the status we read.
    pub status: PvFactsStatus,
    /// The labels a decision reads (see `read_by_us`). A `BTreeMap` allocates room for eleven
    /// entries at its first: two maps were a third of a stored PV.
    labels: Box<[(String, String)]>,
    /// The annotations a decision reads (see `read_by_us`).
    annotations: Box<[(String, String)]>,
    /// Its node affinity honours its volume fence (core::fence::honours_fence). The fence
    /// requirements themselves are not kept: two per term of every stored PV, read by nothing.
    pub fence_honoured: bool,
}

/// A PV as it is decoded, before its labels and annotations are sorted out.
#[derive(Deserialize)]
struct RawPvFacts {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: PvFactsSpec,
    #[serde(default)]
    status: PvFactsStatus,
}

impl From<RawPvFacts> for PvFacts {
    fn from(raw: RawPvFacts) -> Self {
        let mut metadata = raw.metadata;
        let keep = |map: Option<std::collections::BTreeMap<String, String>>| {
            map.into_iter().flatten().filter(|(k, _)| read_by_us(k)).collect::<Vec<_>>().into_boxed_slice()
        };
        let labels = keep(metadata.labels.take());
        let annotations = keep(metadata.annotations.take());
        let mut spec = raw.spec;
        let name = metadata.name.as_deref().unwrap_or_default();
        let fence_honoured = super::fence_label::honours_fence(name, spec.node_affinity.as_ref());
        super::fence_label::strip_fence_requirements(&mut spec.node_affinity);
        PvFacts { metadata, spec, status: raw.status, labels, annotations, fence_honoured }
    }
}

/// Whether a label or annotation key is one any decision reads: ours, upstream's
/// provisioned-by, and the hostname label (useNodeNameOnly adoption). Others (the PV
/// controller's, an operator's) are not kept; patches only ever name our own keys.
fn read_by_us(key: &str) -> bool {
    key.starts_with(OUR_DOMAIN) || key == ANN_PROVISIONED_BY || key == LABEL_HOSTNAME
}

/// The prefix of every label, annotation and finalizer of ours.
const OUR_DOMAIN: &str = "local-static-provisioner.io/";

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
    /// `spec.claimRef`: set once a claim was bound. Boxed: inline it took 168 bytes of every
    /// stored PV, bound or not (a node's unbound PVs are most of its store after a bulk publish).
    #[serde(default)]
    pub claim_ref: Option<Box<ObjectReference>>,
    /// `spec.nodeAffinity`: node-cleanup finds the node a PV is pinned to here.
    #[serde(default)]
    pub node_affinity: Option<VolumeNodeAffinity>,
    /// `spec.capacity.storage` in bytes (None: absent or not a quantity we read): a volume
    /// smaller than it is a failing sign (core::disk_health::shrunk).
    #[serde(default, rename = "capacity", deserialize_with = "storage_bytes")]
    pub capacity_bytes: Option<u64>,
}

/// `spec.capacity.storage` as bytes; anything unreadable is None (never a decode failure).
fn storage_bytes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let map: Option<std::collections::BTreeMap<String, serde_json::Value>> = Option::deserialize(d)?;
    Ok(map
        .as_ref()
        .and_then(|m| m.get("storage"))
        .and_then(|v| v.as_str())
        .and_then(|q| super::device_selector::parse_quantity(q).ok()))
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

    /// One annotation's value, if it is one we read (see `read_by_us`).
    pub fn annotation(&self, key: &str) -> Option<&String> {
        self.annotations.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// One label's value, if it is one we read (see `read_by_us`).
    pub fn label(&self, key: &str) -> Option<&String> {
        self.labels.iter().find(|(k, _)| k == key).map(|(_, v)| v)
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
    use crate::core::naming::*;

    /// A PV as the API returns it, with fields of every kind we skip.
    fn full() -> serde_json::Value {
        json!({
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {
                "name": "local-pv-1",
                "uid": "u1",
                "resourceVersion": "7",
                "labels": {"local-static-provisioner.io/node": "n1", "kubernetes.io/hostname": "h1", "team": "a"},
                "annotations": {
                    "pv.kubernetes.io/provisioned-by": "p",
                    "pv.kubernetes.io/bound-by-controller": "yes",
                    "local-static-provisioner.io/volume-identity": "v2;fs",
                    "local-static-provisioner.io-other/x": "y"
                },
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
        let mut meta = pv.metadata.clone();
        meta.labels = None;
        meta.annotations = None;
        assert_eq!(facts.metadata, meta);
        assert_eq!(facts.spec.local, spec.local);
        assert_eq!(facts.spec.storage_class_name, spec.storage_class_name);
        assert_eq!(facts.spec.persistent_volume_reclaim_policy, spec.persistent_volume_reclaim_policy);
        assert_eq!(facts.spec.claim_ref.as_deref(), spec.claim_ref.as_ref());
        assert_eq!(facts.spec.node_affinity, spec.node_affinity);
        assert_eq!(facts.status.phase, pv.status.as_ref().unwrap().phase);
        assert_eq!(facts.local_path(), Some("/mnt/disks/a"));
        assert_eq!(facts.phase(), "Bound");
        assert_eq!(facts.annotation("pv.kubernetes.io/provisioned-by").map(String::as_str), Some("p"));
        assert_eq!(facts.label("local-static-provisioner.io/node").map(String::as_str), Some("n1"));
        assert_eq!(facts.label("kubernetes.io/hostname").map(String::as_str), Some("h1"));
        assert_eq!(facts.annotation("local-static-provisioner.io/volume-identity").map(String::as_str), Some("v2;fs"));
        // Keys no decision reads are not kept.
        assert_eq!(facts.label("team"), None);
        assert_eq!(facts.annotation("pv.kubernetes.io/bound-by-controller"), None);
        assert_eq!(facts.annotation("local-static-provisioner.io-other/x"), None);
        assert_eq!((facts.labels.len(), facts.annotations.len()), (2, 2));
    }

    #[test]
    fn capacity_is_read_as_bytes_and_anything_else_is_none() {
        let with = |capacity: serde_json::Value| -> Option<u64> {
            let facts: PvFacts = serde_json::from_value(json!({"spec": {"capacity": capacity}})).unwrap();
            facts.spec.capacity_bytes
        };
        assert_eq!(serde_json::from_value::<PvFacts>(full()).unwrap().spec.capacity_bytes, Some(10 << 30));
        assert_eq!(with(json!({"storage": "1536Mi"})), Some(1536 << 20));
        assert_eq!(with(json!({"storage": "67108864"})), Some(64 << 20));
        assert_eq!(with(json!({"storage": "not a size"})), None);
        assert_eq!(with(json!({"cpu": "1"})), None);
        assert_eq!(with(json!(null)), None);
        let facts: PvFacts = serde_json::from_value(json!({"spec": {}})).unwrap();
        assert_eq!(facts.spec.capacity_bytes, None);
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
    fn every_key_of_ours_is_read() {
        for key in [
            LABEL_NODE,
            LABEL_HOSTNAME,
            FINALIZER_WIPE,
            ANN_PROVISIONED_BY,
            ANN_VOLUME_IDENTITY,
            ANN_IDENTITY_CONFIRMED,
            ANN_CLEANUP,
            ANN_CLEANUP_REQUESTED_AT,
            ANN_CLEANUP_RESULT,
            ANN_VOLUME_MISSING,
            ANN_VOLUME_STALE,
            ANN_VOLUME_MOVED_TO,
        ] {
            assert!(read_by_us(key), "{key}");
        }
        for key in
            ["pv.kubernetes.io/bound-by-controller", "kubernetes.io/hostnamex", "local-static-provisioner.io", ""]
        {
            assert!(!read_by_us(key), "{key}");
        }
    }

    #[test]
    fn is_much_smaller_than_the_full_type() {
        assert!(std::mem::size_of::<PvFacts>() * 3 < std::mem::size_of::<PersistentVolume>());
    }
}

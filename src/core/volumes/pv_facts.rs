//! A PersistentVolume as the agent and node-cleanup read it from the API: only the fields a
//! decision reads. The full k8s-openapi struct is 3.5 KiB before any string (every volume
//! source of every driver is inline), so a store of a thousand PVs, or node-cleanup's store of
//! every local PV of a large cluster, kept megabytes of empty fields. JSON is decoded straight
//! into this type (unknown fields are skipped by serde), so the full object never exists.
//! Only creating a PV needs the full type (`core::volumes::pv`).

use k8s_openapi::api::core::v1::{LocalVolumeSource, ObjectReference, VolumeNodeAffinity};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use crate::core::volumes::naming::{ANN_PROVISIONED_BY, LABEL_HOSTNAME};

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
    /// Its node affinity honours its volume fence (core::fence::volume_fence::honours_fence). The fence
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
        let fence_honoured = crate::core::fence::fence_label::honours_fence(name, spec.node_affinity.as_ref());
        crate::core::fence::fence_label::strip_fence_requirements(&mut spec.node_affinity);
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
    /// smaller than it is a failing sign (core::health::disk_health::shrunk).
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
        .and_then(|q| crate::core::devices::device_selector::parse_quantity(q).ok()))
}

/// The parts of `status` the planners read.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct PvFactsStatus {
    /// `status.phase`.
    #[serde(default)]
    pub phase: Option<String>,
}

impl PvFacts {
    /// The host path of a local PV's volume: `spec.local.path`, less the data directory of an
    /// encrypted volume (core::volumes::encryption::volume_path), so every rule about the volume reads
    /// its root whether or not it is encrypted.
    pub fn local_path(&self) -> Option<&str> {
        let encrypted = self.annotation(crate::core::volumes::encryption::ANN_ENCRYPTION).map(String::as_str);
        self.spec.local.as_ref().map(|l| crate::core::volumes::encryption::volume_path(&l.path, encrypted))
    }

    /// The key identifier an encrypted volume's PV names (`None`: not encrypted); an
    /// unreadable annotation is an error, so nothing treats such a volume as unencrypted.
    pub fn encryption_key(&self) -> Result<Option<String>, String> {
        crate::core::volumes::encryption::key_to_destroy(
            self.annotation(crate::core::volumes::encryption::ANN_ENCRYPTION).map(String::as_str),
        )
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

/// Makes a light PV type addressable as a PersistentVolume: kube's `Api`, watcher and store use
/// it through these constants, exactly as for the full type.
macro_rules! addressed_as_a_pv {
    ($ty:ty) => {
        impl k8s_openapi::Resource for $ty {
            const API_VERSION: &'static str = "v1";
            const GROUP: &'static str = "";
            const KIND: &'static str = "PersistentVolume";
            const VERSION: &'static str = "v1";
            const URL_PATH_SEGMENT: &'static str = "persistentvolumes";
            type Scope = k8s_openapi::ClusterResourceScope;
        }

        impl k8s_openapi::ListableResource for $ty {
            const LIST_KIND: &'static str = "PersistentVolumeList";
        }

        impl k8s_openapi::Metadata for $ty {
            type Ty = ObjectMeta;

            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }

            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

addressed_as_a_pv!(PvFacts);

/// What a listing of every PV of the cluster reads of each: its name and the labels and
/// annotations a decision reads (`read_by_us`), nothing more. Adoption judges tens of thousands
/// of other nodes' PVs by whose they are (core::volumes::planner::needs_adoption reads only these);
/// decoding each as `PvFacts` built its managedFields (a JSON tree per field manager) and node
/// affinity only to drop them, which was most of a start-up's time among 20,000 foreign PVs
/// (bench/scale-foreign.sh). The rest of each object is skipped unbuilt; the few PVs kept are
/// read again whole.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PvOwnership {
    /// The name only (labels and annotations are below).
    pub metadata: ObjectMeta,
    labels: Box<[(String, String)]>,
    annotations: Box<[(String, String)]>,
}

impl PvOwnership {
    /// One annotation's value, if it is one we read (see `read_by_us`).
    pub fn annotation(&self, key: &str) -> Option<&String> {
        self.annotations.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// One label's value, if it is one we read (see `read_by_us`).
    pub fn label(&self, key: &str) -> Option<&String> {
        self.labels.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

impl<'de> Deserialize<'de> for PvOwnership {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        /// `metadata` with only the fields read; serde skips the others (managedFields too)
        /// without building them.
        #[derive(Deserialize, Default)]
        struct Meta {
            #[serde(default)]
            name: Option<String>,
            #[serde(default, deserialize_with = "read_keys")]
            labels: Vec<(String, String)>,
            #[serde(default, deserialize_with = "read_keys")]
            annotations: Vec<(String, String)>,
        }
        #[derive(Deserialize)]
        struct Raw {
            #[serde(default)]
            metadata: Meta,
        }
        let Raw { metadata } = Raw::deserialize(d)?;
        Ok(PvOwnership {
            metadata: ObjectMeta { name: metadata.name, ..ObjectMeta::default() },
            labels: metadata.labels.into_boxed_slice(),
            annotations: metadata.annotations.into_boxed_slice(),
        })
    }
}

/// The entries of a string map whose key a decision reads (`read_by_us`); the others are
/// dropped as they are read. A null map reads as empty.
fn read_keys<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<(String, String)>, D::Error> {
    struct Keys;
    impl<'de> serde::de::Visitor<'de> for Keys {
        type Value = Vec<(String, String)>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map of strings")
        }

        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut kept = Vec::new();
            while let Some(key) = map.next_key::<String>()? {
                let value = map.next_value::<String>()?;
                if read_by_us(&key) {
                    kept.push((key, value));
                }
            }
            Ok(kept)
        }
    }
    d.deserialize_any(Keys)
}

addressed_as_a_pv!(PvOwnership);

#[cfg(test)]
mod tests {
    use k8s_openapi::Resource as _;
    use k8s_openapi::api::core::v1::PersistentVolume;
    use serde_json::json;

    use super::*;
    use crate::core::volumes::naming::*;

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
    fn an_encrypted_volume_is_read_at_its_root_with_its_key() {
        let key = "0123456789abcdef0123456789abcdef";
        let mut json = full();
        json["spec"]["local"]["path"] = "/mnt/disks/a/lsp-encrypted".into();
        json["metadata"]["annotations"]["local-static-provisioner.io/encryption"] =
            format!("fscrypt-v2 key={key}").into();
        let facts: PvFacts = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(facts.local_path(), Some("/mnt/disks/a"));
        assert_eq!(facts.encryption_key(), Ok(Some(key.to_string())));
        // An unreadable annotation is an error, never "not encrypted".
        json["metadata"]["annotations"]["local-static-provisioner.io/encryption"] = "fscrypt-v2 key=zz".into();
        let facts: PvFacts = serde_json::from_value(json).unwrap();
        assert!(facts.encryption_key().is_err());
        let plain: PvFacts = serde_json::from_value(full()).unwrap();
        assert_eq!(plain.encryption_key(), Ok(None));
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
    fn ownership_reads_the_name_and_the_keys_facts_read_and_nothing_else() {
        let facts: PvFacts = serde_json::from_value(full()).unwrap();
        let owner: PvOwnership = serde_json::from_value(full()).unwrap();
        assert_eq!(owner.metadata, ObjectMeta { name: Some("local-pv-1".into()), ..ObjectMeta::default() });
        assert_eq!(&*owner.labels, &*facts.labels);
        assert_eq!(&*owner.annotations, &*facts.annotations);
        // Null or absent maps, and no metadata at all, read as empty.
        let bare: PvOwnership = serde_json::from_value(json!({"metadata": {"name": "x", "labels": null}})).unwrap();
        assert_eq!((bare.label(LABEL_NODE), bare.annotation(ANN_PROVISIONED_BY)), (None, None));
        let empty: PvOwnership = serde_json::from_value(json!({"spec": {}})).unwrap();
        assert_eq!(empty, PvOwnership::default());
        // A map that is not one of strings is refused, as the full type refuses it.
        assert!(serde_json::from_value::<PvOwnership>(json!({"metadata": {"labels": {"a": 1}}})).is_err());
        assert_eq!(PvOwnership::URL_PATH_SEGMENT, PersistentVolume::URL_PATH_SEGMENT);
        assert_eq!(PvOwnership::KIND, PersistentVolume::KIND);
    }

    #[test]
    fn is_much_smaller_than_the_full_type() {
        assert!(std::mem::size_of::<PvFacts>() * 3 < std::mem::size_of::<PersistentVolume>());
    }
}

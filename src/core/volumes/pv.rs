//! Building PersistentVolume objects exactly as upstream does, from a discovered volume and the
//! facts about its node and StorageClass. Pure: everything it needs is passed in.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    LocalVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume, PersistentVolumeSpec,
    VolumeNodeAffinity,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::core::config::settings::{ClassConfig, ProvisionerConfig};
use crate::core::fence::fence_label::fence_requirements;
use crate::core::volumes::capacity::binary_si_quantity;
use crate::core::volumes::naming::{
    ANN_ALPHA_NODE_AFFINITY, ANN_PROVISIONED_BY, ANN_VOLUME_IDENTITY, FINALIZER_WIPE, LABEL_DISK_ID, LABEL_HOSTNAME,
    LABEL_NODE, node_label_value,
};
pub use crate::core::volumes::pv_inputs::ClassPolicy;
use crate::core::volumes::pv_inputs::DesiredPv;
use crate::core::volumes::volume_safety::DiskKey;

/// What the PV needs to know about this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// The Node object's name.
    pub name: String,
    /// The Node object's UID (part of the provisioned-by annotation and the owner reference).
    pub uid: String,
    /// The Node's labels: the hostname label feeds node affinity, others nodeLabelsForPV.
    pub labels: BTreeMap<String, String>,
}

impl NodeInfo {
    /// The value pods are scheduled by; the node name when the label is absent (dry runs).
    pub fn hostname(&self) -> &str {
        self.labels.get(LABEL_HOSTNAME).map_or(self.name.as_str(), String::as_str)
    }
}

/// A volume found on this node that should be published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundVolume {
    /// StorageClass name (key of storageClassMap).
    pub class: String,
    /// First-level entry name under the discovery directory.
    pub entry: String,
    /// Path on the host (hostDir joined with the entry).
    pub host_path: String,
    /// Rounded capacity in bytes.
    pub capacity_bytes: u64,
    /// Fingerprint of the disk (see host::identity::fingerprint), recorded on the PV.
    pub identity: String,
    /// What the volume occupies, to publish each disk at most once.
    pub disk: DiskKey,
    /// Why the host is using this block device (mounted, held, open exclusively), if it is:
    /// such a device is not published, though an existing PV keeps it.
    pub in_use: Option<String>,
    /// What the disk's used mark says (read by discovery; see core::identity::used_mark).
    pub used: crate::core::identity::used_mark::UsedRead,
}

impl FoundVolume {
    /// The facts of this volume that go into its PV.
    #[cfg(test)]
    pub fn source(&self) -> PvSource<'_> {
        PvSource {
            class: &self.class,
            host_path: &self.host_path,
            capacity_bytes: self.capacity_bytes,
            identity: &self.identity,
        }
    }
}

/// The facts of one volume that its PV object records (the rest comes from the class and the
/// node), borrowed from a found or a desired volume.
#[derive(Debug, Clone, Copy)]
pub struct PvSource<'a> {
    /// StorageClass name.
    pub class: &'a str,
    /// Path on the host.
    pub host_path: &'a str,
    /// Rounded capacity in bytes.
    pub capacity_bytes: u64,
    /// Fingerprint of the disk.
    pub identity: &'a str,
}

/// Everything that is the same for all PVs of one pass.
pub struct PvContext<'a> {
    /// The effective config.
    pub config: &'a ProvisionerConfig,
    /// This node.
    pub node: &'a NodeInfo,
    /// The provisioned-by value for this node.
    pub provisioner_name: &'a str,
}

impl PvContext<'_> {
    /// The PV upstream would create for `volume`, plus our node label, the volume identity and
    /// our wipe finalizer.
    pub fn build(
        &self,
        name: &str,
        class: &ClassConfig,
        policy: &ClassPolicy,
        volume: PvSource<'_>,
    ) -> PersistentVolume {
        let mut labels = BTreeMap::new();
        for key in &self.config.node_labels_for_pv {
            if let Some(value) = self.node.labels.get(key) {
                labels.insert(key.clone(), value.clone());
            }
        }
        labels.extend(self.config.labels_for_pv.iter().map(|(k, v)| (k.clone(), v.clone())));
        labels.insert(LABEL_NODE.to_string(), node_label_value(&self.node.name));
        // The whole disk it is on, so another node that finds the disk finds this PV with one
        // label-selected list (core::identity::disk_trust).
        if let Some(disk) = crate::core::identity::disk_trust::disk_label(volume.identity) {
            labels.insert(LABEL_DISK_ID.to_string(), disk);
        }

        let mut annotations = BTreeMap::from([
            (ANN_PROVISIONED_BY.to_string(), self.provisioner_name.to_string()),
            (ANN_VOLUME_IDENTITY.to_string(), volume.identity.to_string()),
        ]);
        let node_affinity = if self.config.use_alpha_api {
            // Upstream's form, unfenced: no current kubelet or scheduler reads the annotation.
            let affinity = self.node_affinity(None, class);
            // Serializing plain k8s-openapi structs to JSON cannot fail.
            let json = serde_json::to_string(&affinity.required).unwrap_or_default();
            annotations.insert(
                ANN_ALPHA_NODE_AFFINITY.to_string(),
                format!("{{\"requiredDuringSchedulingIgnoredDuringExecution\":{json}}}"),
            );
            None
        } else {
            Some(self.node_affinity(Some(name), class))
        };
        let owner_references = self.config.set_pv_owner_ref.then(|| {
            vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: self.node.name.clone(),
                uid: self.node.uid.clone(),
                ..Default::default()
            }]
        });
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels: Some(labels),
                annotations: Some(annotations),
                finalizers: Some(vec![FINALIZER_WIPE.to_string()]),
                owner_references,
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                capacity: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(binary_si_quantity(volume.capacity_bytes)),
                )])),
                local: Some(LocalVolumeSource { path: volume.host_path.to_string(), fs_type: class.fs_type.clone() }),
                access_modes: Some(vec![class.access_mode.clone()]),
                storage_class_name: Some(volume.class.to_string()),
                persistent_volume_reclaim_policy: Some(policy.reclaim_policy.clone()),
                mount_options: (!policy.mount_options.is_empty()).then(|| policy.mount_options.clone()),
                volume_mode: Some(class.volume_mode.as_str().to_string()),
                node_affinity,
                ..Default::default()
            }),
            status: None,
        }
    }

    /// The PV object of a desired volume, built when the planner decided to create it; None
    /// when its class is no longer configured.
    pub fn pv_for(&self, desired: &DesiredPv) -> Option<PersistentVolume> {
        let class = self.config.storage_class_map.get(&desired.class)?;
        let source = PvSource {
            class: &desired.class,
            host_path: &desired.host_path,
            capacity_bytes: desired.capacity_bytes,
            identity: &desired.identity,
        };
        Some(self.build(&desired.name, class, &desired.policy, source))
    }

    /// The node's own hostname term first, then the class's selector terms as separate (ORed)
    /// terms, as upstream does for shared filesystems. Every term also requires the volume's
    /// fence labels to be absent from the node (core::fence::volume_fence), so no pod mounts the volume while
    /// its path holds another disk, wherever the term would place it (`fenced`: the PV name).
    fn node_affinity(&self, fenced: Option<&str>, class: &ClassConfig) -> VolumeNodeAffinity {
        let hostname = NodeSelectorRequirement {
            key: LABEL_HOSTNAME.into(),
            operator: "In".into(),
            values: Some(vec![self.node.hostname().to_string()]),
        };
        let fences = fenced.map(fence_requirements).unwrap_or_default();
        let terms = std::iter::once(NodeSelectorTerm { match_expressions: Some(vec![hostname]), match_fields: None })
            .chain(class.selector.iter().cloned())
            .map(|mut term| {
                term.match_expressions.get_or_insert_with(Vec::new).extend(fences.iter().cloned());
                term
            })
            .collect();
        VolumeNodeAffinity { required: Some(NodeSelector { node_selector_terms: terms }) }
    }
}

/// The host path of a PV, if it is a local PV.
pub fn local_path(pv: &PersistentVolume) -> Option<&str> {
    pv.spec.as_ref()?.local.as_ref().map(|l| l.path.as_str())
}

/// Joins hostDir and an entry the way Go's `filepath.Join` does, so PV paths match upstream's.
pub fn host_path(host_dir: &str, entry: &str) -> String {
    clean_path(&format!("{host_dir}/{entry}"))
}

/// Go's `filepath.Clean` for absolute paths without `..` (config validation rejects those):
/// repeated slashes and `.` elements removed, no trailing slash.
pub fn clean_path(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
    format!("/{}", parts.join("/"))
}

/// Where a PV's volume is inside this container: its host path must be a direct entry of the
/// class's hostDir (never the directory itself, a deeper path, `.` or `..`), which maps to the
/// same entry of the class's mountDir. Anything else is refused, so a PV's path can never lead
/// the agent out of a discovery directory.
pub fn container_path(host_path: &str, host_dir: &str, mount_dir: &str) -> Result<std::path::PathBuf, String> {
    let host_dir = clean_path(host_dir);
    let rel = host_path
        .strip_prefix(&format!("{host_dir}/"))
        .filter(|rel| !rel.is_empty() && !rel.contains('/') && *rel != "." && *rel != "..")
        .ok_or_else(|| format!("path {host_path} is not an entry of hostDir {host_dir}"))?;
    Ok(std::path::Path::new(mount_dir).join(rel))
}

#[cfg(test)]
#[path = "pv_tests.rs"]
mod tests;

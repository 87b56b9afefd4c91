//! The PVs as both the planner and PV construction read them: a desired PV (a volume to
//! publish with what its PV is made of), an observed one, and the StorageClass policy copied
//! onto each. Below both, so neither imports the other (planner and pv re-export them).

use crate::core::identity::used_mark::UsedRead;
use crate::core::volumes::naming::{ANN_PROVISIONED_BY, ANN_VOLUME_IDENTITY, LABEL_HOSTNAME, LABEL_NODE};
use crate::core::volumes::pv_facts::{PvFacts, PvOwnership};
use crate::core::volumes::volume_safety::DiskKey;

/// The StorageClass settings that upstream copies onto each PV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassPolicy {
    /// `Delete` or `Retain`.
    pub reclaim_policy: String,
    /// Mount options kubelet will use.
    pub mount_options: Vec<String>,
}

impl Default for ClassPolicy {
    /// Upstream's behaviour for a class object without these fields.
    fn default() -> Self {
        ClassPolicy { reclaim_policy: "Delete".into(), mount_options: Vec::new() }
    }
}

/// A volume discovery wants published, with what its PV would be made of. The PV object itself
/// is built only when the planner decides to create it (`PvContext::pv_for`): a node with a
/// thousand published volumes would otherwise build a thousand 3.5 KiB objects on every pass.
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredPv {
    /// PV name (upstream's hash).
    pub name: String,
    /// Host path of the volume.
    pub host_path: String,
    /// StorageClass name (key of storageClassMap).
    pub class: String,
    /// What the class's StorageClass says to copy onto the PV.
    pub policy: ClassPolicy,
    /// Rounded capacity in bytes (for metrics).
    pub capacity_bytes: u64,
    /// The disk fingerprint recorded on the PV.
    pub identity: String,
    /// What the volume occupies (one disk, at most one PV).
    pub disk: DiskKey,
    /// Why the host uses this block device, if it does (not published unless already).
    pub in_use: Option<String>,
    /// What the disk's used mark says (see core::identity::used_mark).
    pub used: UsedRead,
    /// The PV its mark names, read from the API when it is not one of this node's PVs (a disk
    /// moved here from another node): it still holds that PV's data if it records this disk.
    pub mark_holder: Option<ObservedPv>,
}

/// What the planner needs to know about an existing PV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedPv {
    /// PV name.
    pub name: String,
    /// `spec.local.path`, if it is a local PV.
    pub host_path: Option<String>,
    /// `pv.kubernetes.io/provisioned-by`.
    pub provisioned_by: Option<String>,
    /// The `kubernetes.io/hostname` label (used by useNodeNameOnly adoption).
    pub hostname_label: Option<String>,
    /// Our node label.
    pub node_label: Option<String>,
    /// The disk fingerprint recorded on the PV, if any.
    pub identity: Option<String>,
}

impl ObservedPv {
    /// Extracts the fields the planner looks at.
    pub fn from_pv(pv: &PvFacts) -> Self {
        ObservedPv {
            name: pv.metadata.name.clone().unwrap_or_default(),
            host_path: pv.local_path().map(str::to_string),
            provisioned_by: pv.annotation(ANN_PROVISIONED_BY).cloned(),
            hostname_label: pv.label(LABEL_HOSTNAME).cloned(),
            node_label: pv.label(LABEL_NODE).cloned(),
            identity: pv.annotation(ANN_VOLUME_IDENTITY).cloned(),
        }
    }

    /// The same from a PV's name, labels and annotations only (a listing of every PV of the
    /// cluster): no host path, which whose PV it is (`needs_adoption`) never reads.
    pub fn from_ownership(pv: &PvOwnership) -> Self {
        ObservedPv {
            name: pv.metadata.name.clone().unwrap_or_default(),
            host_path: None,
            provisioned_by: pv.annotation(ANN_PROVISIONED_BY).cloned(),
            hostname_label: pv.label(LABEL_HOSTNAME).cloned(),
            node_label: pv.label(LABEL_NODE).cloned(),
            identity: pv.annotation(ANN_VOLUME_IDENTITY).cloned(),
        }
    }
}
